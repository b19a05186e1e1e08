"""Value encoding for the cache: compressed JSON, never pickle.

``encode`` writes a zstandard frame (level 3) of compact UTF-8 JSON; ``decode``
accepts zstandard, gzip or plain JSON so values written by other tools still
read back.  ``decompress`` is also used for request bodies.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import zstandard

from autopar.errors import AutoparError

__all__ = [
    "GZIP_MAGIC",
    "ZSTD_MAGIC",
    "DecodeError",
    "compress",
    "decode",
    "decompress",
    "dumps",
    "encode",
    "inflate",
]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
_LEVEL = 3


class DecodeError(AutoparError):
    """Raised when stored or uploaded bytes are not valid (compressed) JSON, or inflate too far."""

    default_code = "bad_encoding"


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (no spaces, UTF-8)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def encode(obj: Any) -> bytes:
    """``obj`` as a zstandard-compressed JSON frame."""
    return zstandard.ZstdCompressor(level=_LEVEL).compress(dumps(obj))


def compress(raw: bytes) -> bytes:
    """Raw bytes as a zstandard frame (for values that are already JSON)."""
    return zstandard.ZstdCompressor(level=_LEVEL).compress(raw)


def decompress(data: bytes, encoding: str, max_bytes: int) -> bytes:
    """Inflate ``data`` (``encoding`` is ``"zstd"``, ``"gzip"`` or ``"identity"``).

    Raises :class:`DecodeError` with code ``too_large`` once the output passes
    ``max_bytes`` (a decompression bomb stops there), or ``bad_encoding`` when
    the data is not in that format.
    """
    if encoding == "identity":
        out = data
    elif encoding == "zstd":
        chunks: list[bytes] = []
        size = 0
        try:
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                while size <= max_bytes:
                    chunk = reader.read(min(1 << 20, max_bytes + 1 - size))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
        except zstandard.ZstdError as exc:
            raise DecodeError("bad_encoding", f"body is not a valid zstd frame: {exc}") from None
        out = b"".join(chunks)
    elif encoding == "gzip":
        try:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out = inflater.decompress(data, max_bytes + 1)
        except zlib.error as exc:
            raise DecodeError("bad_encoding", f"body is not valid gzip: {exc}") from None
        if len(out) <= max_bytes and not inflater.eof:
            raise DecodeError("bad_encoding", "gzip body is truncated")
    else:
        raise DecodeError("unsupported_encoding", f"unknown content encoding {encoding!r}")
    if len(out) > max_bytes:
        raise DecodeError(
            "too_large",
            f"the decompressed body exceeds {max_bytes} bytes; send a smaller graph or raise the limit",
            limit_bytes=max_bytes,
        )
    return out


def decode(data: bytes, max_bytes: int = 1 << 31) -> Any:
    """Parse a value written by :func:`encode` (or gzip / plain JSON)."""
    if data.startswith(ZSTD_MAGIC):
        raw = decompress(data, "zstd", max_bytes)
    elif data.startswith(GZIP_MAGIC):
        raw = decompress(data, "gzip", max_bytes)
    else:
        raw = data
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DecodeError("bad_encoding", f"stored value is not JSON: {exc}") from None


def inflate(data: bytes, max_bytes: int = 1 << 31) -> bytes:
    """The JSON bytes inside a value written by :func:`encode` / :func:`compress`."""
    if data.startswith(ZSTD_MAGIC):
        return decompress(data, "zstd", max_bytes)
    if data.startswith(GZIP_MAGIC):
        return decompress(data, "gzip", max_bytes)
    return data
