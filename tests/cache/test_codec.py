from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from autopar_cache import codec


def test_encode_decode_roundtrip_and_compresses() -> None:
    obj = {"ops": [{"name": f"op{i}", "type": "matmul"} for i in range(500)], "x": 1.5, "u": "é"}
    data = codec.encode(obj)
    assert data.startswith(codec.ZSTD_MAGIC)
    assert len(data) < len(json.dumps(obj)) / 4
    assert codec.decode(data) == obj


def test_decode_accepts_gzip_and_plain() -> None:
    obj = {"a": [1, 2, 3]}
    assert codec.decode(gzip.compress(json.dumps(obj).encode())) == obj
    assert codec.decode(json.dumps(obj).encode()) == obj


def test_never_pickle() -> None:
    with pytest.raises(TypeError):
        codec.encode({"s": {1, 2}})  # sets are not JSON; nothing falls back to pickle


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_decompress_caps_output(encoding: str) -> None:
    raw = b"0" * 1_000_000
    packed = gzip.compress(raw) if encoding == "gzip" else zstandard.ZstdCompressor().compress(raw)
    assert len(packed) < 10_000
    assert codec.decompress(packed, encoding, 1_000_000) == raw
    with pytest.raises(codec.DecodeError) as info:
        codec.decompress(packed, encoding, 999_999)
    assert info.value.code == "too_large"


def test_decompress_zstd_without_content_size() -> None:
    raw = b"abc" * 100_000
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    packed = cctx.compress(raw)
    assert codec.decompress(packed, "zstd", len(raw)) == raw
    with pytest.raises(codec.DecodeError):
        codec.decompress(packed, "zstd", len(raw) - 1)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_decompress_rejects_garbage(encoding: str) -> None:
    with pytest.raises(codec.DecodeError) as info:
        codec.decompress(b"definitely not compressed", encoding, 1000)
    assert info.value.code == "bad_encoding"


def test_truncated_gzip_rejected() -> None:
    packed = gzip.compress(b"x" * 10_000)
    with pytest.raises(codec.DecodeError):
        codec.decompress(packed[:-8], "gzip", 100_000)


def test_unknown_encoding() -> None:
    with pytest.raises(codec.DecodeError) as info:
        codec.decompress(b"", "br", 10)
    assert info.value.code == "unsupported_encoding"
