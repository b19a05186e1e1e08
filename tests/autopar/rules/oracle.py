"""Numeric oracle for SBP signatures.

For a signature, lay every logical input out on a small mesh as its N-D SBP
says (``S(d)``: contiguous pieces along ``d``; ``B``: copies; ``P``: random
addends that sum to the tensor), run a numpy reference of the op on each
device's local tensors, then put every output back together as its SBP says
(concatenate ``S``, sum ``P``, and require all ``B`` copies to be equal).  The
signature is right iff that equals the op applied to the logical inputs.

Local kernels see the offsets of their blocks (``info.offsets``) -- what a
vocab-parallel lookup needs -- and the local output shapes; nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autopar.ir.sbp import Broadcast, NdSbp, Partial, Signature, Split, local_shape
from autopar.rules import RuleContext
from autopar.rules.families._common import base_name
from autopar.runtimes.oneflow_09.lowering import device_slices
from tests.autopar.rules.helpers import signatures


@dataclass
class LocalInfo:
    """What a local kernel knows besides its tensors."""

    offsets: dict[str, tuple[int, ...]]
    """Input port base name -> start index of the local block along each dim."""
    out_shapes: dict[str, tuple[int, ...]]
    """Output port base name -> local shape."""
    logical_in: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Input port base name -> logical shape."""


Kernel = Callable[[dict[str, np.ndarray], Mapping[str, Any], LocalInfo], dict[str, np.ndarray]]


def _distribute(
    x: np.ndarray,
    values: Sequence[Any],
    mesh: Sequence[int],
    rng: np.random.Generator,
    offset: tuple[int, ...],
) -> list[tuple[np.ndarray, tuple[int, ...]]]:
    if not values:
        return [(x, offset)]
    v, n = values[0], mesh[0]
    pieces: list[tuple[np.ndarray, tuple[int, ...]]] = []
    if isinstance(v, Broadcast):
        pieces = [(x.copy(), offset) for _ in range(n)]
    elif isinstance(v, Partial):
        addends = [rng.standard_normal(x.shape) for _ in range(n - 1)]
        addends.append(x - sum(addends, np.zeros_like(x)))
        pieces = [(a, offset) for a in addends]
    else:
        assert isinstance(v, Split)
        # OneFlow's BalancedSplitter: the first size % n parts one row longer (numpy's array_split)
        start_row = 0
        for part in np.array_split(x, n, axis=v.dim):
            start = list(offset)
            start[v.dim] += start_row
            start_row += part.shape[v.dim]
            pieces.append((part, tuple(start)))
    out = []
    for piece, piece_offset in pieces:
        out += _distribute(piece, values[1:], mesh[1:], rng, piece_offset)
    return out


def _combine(locals_: list[np.ndarray], values: Sequence[Any], mesh: Sequence[int], what: str) -> np.ndarray:
    if not values:
        return locals_[0]
    n = mesh[0]
    m = len(locals_) // n
    groups = [_combine(locals_[i * m : (i + 1) * m], values[1:], mesh[1:], what) for i in range(n)]
    v = values[0]
    if isinstance(v, Broadcast):
        for g in groups[1:]:
            assert g.shape == groups[0].shape and np.allclose(g, groups[0]), (
                f"{what}: B copies differ across devices"
            )
        return groups[0]
    if isinstance(v, Partial):
        return sum(groups[1:], groups[0].astype(np.float64))
    assert isinstance(v, Split)
    return np.concatenate(groups, axis=v.dim)


def _named(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Kernel view of the inputs: full port names, plus the base name of each port."""
    out = dict(arrays)
    for port, value in arrays.items():
        out.setdefault(base_name(port), value)
    return out


def check_signature(
    ctx: RuleContext, inputs: Mapping[str, np.ndarray], sig: Signature, seed: int = 0
) -> None:
    """Raise AssertionError when ``sig`` does not reproduce ``ctx``'s op on ``inputs``."""
    mesh = ctx.mesh_shape
    kern = KERNELS[ctx.op.type]
    in_ports = list(ctx.op.inputs)
    out_ports = list(ctx.op.outputs)
    attrs = {**ctx.attrs, "__op__": ctx.op.type, "__out__": base_name(out_ports[0])}
    rng = np.random.default_rng(seed)
    logical_in = {base_name(p): tuple(inputs[p].shape) for p in in_ports}
    logical_out = {base_name(p): s.shape for p, s in zip(out_ports, ctx.outputs, strict=True)}
    zero = {p: (0,) * inputs[p].ndim for p in in_ports}
    expected = kern(_named(inputs), attrs, LocalInfo(_named_offsets(zero), logical_out, logical_in))
    n_dev = math.prod(mesh)
    per_port = [
        _distribute(inputs[p], sbp.values, mesh, rng, (0,) * inputs[p].ndim)
        for p, sbp in zip(in_ports, sig.inputs, strict=True)
    ]
    local_outs: dict[str, list[np.ndarray]] = {p: [] for p in out_ports}
    for dev in range(n_dev):
        local_in = {p: per_port[i][dev][0] for i, p in enumerate(in_ports)}
        offsets = {p: per_port[i][dev][1] for i, p in enumerate(in_ports)}
        out_shapes = {}
        coord = np.unravel_index(dev, mesh)
        for p, sbp in zip(out_ports, sig.outputs, strict=True):
            logical = logical_out[base_name(p)]
            assert local_shape(logical, NdSbp(tuple(sbp.values)), mesh) is not None, f"{sig}: output {p}"
            box = device_slices(logical, NdSbp(tuple(sbp.values)), mesh, [int(c) for c in coord])
            out_shapes[base_name(p)] = tuple(hi - lo for lo, hi in box)
        got = kern(_named(local_in), attrs, LocalInfo(_named_offsets(offsets), out_shapes, logical_in))
        for p in out_ports:
            local_outs[p].append(np.asarray(got[base_name(p)], dtype=np.float64))
    for p, sbp in zip(out_ports, sig.outputs, strict=True):
        what = f"{ctx.op.type} {sig} port {p}"
        combined = _combine(local_outs[p], sbp.values, mesh, what)
        want = np.asarray(expected[base_name(p)], dtype=np.float64)
        assert combined.shape == want.shape, f"{what}: shape {combined.shape} != {want.shape}"
        assert np.allclose(combined, want, rtol=1e-7, atol=1e-9), f"{what}: wrong values"


def _named_offsets(offsets: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    out = dict(offsets)
    for port, value in offsets.items():
        out.setdefault(base_name(port), value)
    return out


def check_all(
    ctx: RuleContext, inputs: Mapping[str, np.ndarray], skip: Callable[[str], bool] | None = None
) -> int:
    """Check every signature the rule offers for ``ctx``; returns how many were checked."""
    sigs = signatures(ctx)
    checked = 0
    for i, s in enumerate(sigs):
        if skip is not None and skip(str(s)):
            continue
        check_signature(ctx, inputs, s, seed=i)
        checked += 1
    return checked


# ---------------------------------------------------------------- reference kernels

KERNELS: dict[str, Kernel] = {}


def kernel(*names: str) -> Callable[[Kernel], Kernel]:
    def deco(fn: Kernel) -> Kernel:
        for n in names:
            KERNELS[n] = fn
        return fn

    return deco


def _mm(a: np.ndarray, b: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    if attrs.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


@kernel("matmul", "batch_matmul", "broadcast_matmul")
def _matmul(t, attrs, info):
    out = _mm(t["a"], t["b"], attrs)
    if "_add_to_output" in t:
        out = out + t["_add_to_output"]
    return {"out": out}


@kernel("broadcast_matmul_grad_b")
def _mm_grad_b(t, attrs, info):
    a, b = t["a"], t["b"]
    return {"out": a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])}


@kernel("fused_matmul_bias")
def _fmb(t, attrs, info):
    return {"out": t["x"] @ t["weight"].T + t["bias"]}


_BINARY = {
    "broadcast_add": np.add, "broadcast_sub": np.subtract, "broadcast_mul": np.multiply,
    "multiply": np.multiply, "broadcast_div": np.divide, "broadcast_maximum": np.maximum,
    "elementwise_minimum": np.minimum, "broadcast_pow": np.power,
}  # fmt: skip


@kernel(*_BINARY)
def _binary(t, attrs, info):
    op = attrs["__op__"]
    return {"z": _BINARY[op](t["x"], t["y"])}


@kernel("add_n")
def _add_n(t, attrs, info):
    return {"out": sum(v for k, v in t.items() if k.startswith("in_"))}


@kernel("where")
def _where(t, attrs, info):
    return {"out": np.where(t["condition"] > 0.5, t["x"], t["y"])}


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0), "gelu": _gelu, "fast_gelu": _gelu, "tanh": np.tanh,
    "square": np.square, "exp": np.exp, "scalar_add": lambda x: x + 3.0,
    "scalar_mul": lambda x: x * 3.0, "scalar_div": lambda x: x / 4.0,
    "identity": lambda x: x, "amp_white_identity": lambda x: x, "cast": lambda x: x,
    "negative": lambda x: -x, "scalar_pow": lambda x: x**2,
}  # fmt: skip


@kernel(*_UNARY)
def _unary(t, attrs, info):
    x = next(iter(t.values()))
    return {attrs["__out__"]: _UNARY[attrs["__op__"]](x)}


_UNARY_GRAD = {
    "relu_grad": ("y", lambda y, dy: dy * (y > 0)),
    "tanh_grad": ("x", lambda x, dy: dy * (1 - np.tanh(x) ** 2)),
    "gelu_grad": ("x", lambda x, dy: dy * (1 + x**2)),
    "square_grad": ("x", lambda x, dy: 2 * x * dy),
    "dropout_grad": ("mask", lambda m, dy: dy * m * 2.0),
}


@kernel(*_UNARY_GRAD)
def _unary_grad(t, attrs, info):
    other, fn = _UNARY_GRAD[attrs["__op__"]]
    return {"dx": fn(t[other], t["dy"])}


@kernel("broadcast_div_grad")
def _div_grad(t, attrs, info):
    y, z, dz = t["y"], t["z"], t["dz"]
    full = -dz * z / y
    return {"dy": _sum_to(full, y.shape)}


def _sum_to(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Sum ``x`` over the dims numpy broadcasting added to reach its shape from ``shape``."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


# ---- reductions


def _axes(attr: Any, ndim: int) -> tuple[int, ...]:
    if attr is None or (isinstance(attr, list) and not attr):
        return tuple(range(ndim))
    return tuple(sorted(a % ndim for a in attr))


@kernel("reduce_sum", "reduce_mean", "reduce_max")
def _reduce(t, attrs, info):
    x = t["input_tensor"]
    axes = _axes(attrs.get("axis"), x.ndim)
    keep = bool(attrs.get("keepdims", False))
    op = attrs["__op__"]
    if op == "reduce_max":
        return {"output_tensor": x.max(axis=axes, keepdims=keep)}
    out = x.sum(axis=axes, keepdims=keep)
    if op == "reduce_mean":  # divides by the logical count
        logical = info.logical_in["input_tensor"]
        out = out / math.prod(logical[a] for a in axes)
    return {"output_tensor": out}


@kernel("reduce_sum_like")
def _reduce_sum_like(t, attrs, info):
    x = t["x"]
    axes = _axes(attrs.get("axis"), x.ndim)
    return {"y": x.sum(axis=axes).reshape(info.out_shapes["y"])}


@kernel("broadcast_like")
def _broadcast_like(t, attrs, info):
    x, like = t["x"], t["like"]
    axes = _axes(attrs.get("broadcast_axes"), like.ndim)
    if x.ndim != like.ndim:
        x = np.expand_dims(x, axes)
    return {"y": np.broadcast_to(x, like.shape).copy()}


@kernel("square_sum")
def _square_sum(t, attrs, info):
    return {"y": np.array([np.sum(t["x"] ** 2)])}


# ---- views


@kernel("reshape", "flatten", "expand_dims", "squeeze")
def _reshape(t, attrs, info):
    x = next(iter(t.values()))
    return {"out": x.reshape(info.out_shapes["out"])}


@kernel("reshape_like")
def _reshape_like(t, attrs, info):
    return {"out": t["in"].reshape(t["like"].shape)}


@kernel("transpose")
def _transpose(t, attrs, info):
    return {"output": np.transpose(t["input"], attrs["perm"])}


@kernel("expand")
def _expand(t, attrs, info):
    x = t["in"]
    return {"out": np.broadcast_to(x, info.out_shapes["out"]).copy()}


@kernel("slice")
def _slice(t, attrs, info):
    x = t["x"]
    idx = tuple(
        slice(s, e, st) for s, e, st in zip(attrs["start"], attrs["stop"], attrs["step"], strict=True)
    )
    return {"y": x[idx]}


@kernel("concat")
def _concat(t, attrs, info):
    parts = [t[k] for k in sorted(t) if k.startswith("in_")]
    return {"out": np.concatenate(parts, axis=attrs["axis"])}


# ---- nn


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@kernel("softmax")
def _softmax_k(t, attrs, info):
    return {"out": _softmax(t["in"])}


@kernel("softmax_grad")
def _softmax_grad(t, attrs, info):
    y, dy = t["y"], t["dy"]
    return {"dx": y * (dy - (dy * y).sum(axis=-1, keepdims=True))}


@kernel("fused_scale_mask_softmax")
def _fsms(t, attrs, info):
    x = np.where(t["mask"] > 0.5, t["x"] * attrs["scale_value"], attrs["mask_fill_value"])
    return {"y": _softmax(x)}


@kernel("layer_norm")
def _layer_norm(t, attrs, info):
    x = t["x"]
    axes = tuple(range(attrs["begin_norm_axis"], x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + 1e-5)
    y = (x - mean) * inv * t["gamma"] + t["beta"]
    stat_shape = x.shape[: attrs["begin_norm_axis"]]
    return {"y": y, "mean": mean.reshape(stat_shape), "inv_variance": inv.reshape(stat_shape)}


def _expand_stats(s: np.ndarray, ndim: int) -> np.ndarray:
    return s.reshape(s.shape + (1,) * (ndim - s.ndim))


@kernel("layer_norm_param_grad")
def _ln_param_grad(t, attrs, info):
    dy, x = t["dy"], t["x"]
    mean = _expand_stats(t["mean"], x.ndim)
    inv = _expand_stats(t["inv_variance"], x.ndim)
    rows = tuple(range(attrs["begin_params_axis"]))
    return {
        "beta_diff": dy.sum(axis=rows),
        "gamma_diff": (dy * (x - mean) * inv).sum(axis=rows),
    }


@kernel("layer_norm_grad")
def _ln_grad(t, attrs, info):
    dy, x = t["dy"], t["x"]
    mean = _expand_stats(t["mean"], x.ndim)
    inv = _expand_stats(t["inv_variance"], x.ndim)
    axes = tuple(range(attrs["begin_norm_axis"], x.ndim))
    g = dy * t["gamma"]
    xhat = (x - mean) * inv
    n = math.prod(x.shape[a] for a in axes)
    dx = inv * (g - g.sum(axis=axes, keepdims=True) / n - xhat * (g * xhat).sum(axis=axes, keepdims=True) / n)
    return {"dx": dx}


@kernel("rms_norm")
def _rms_norm(t, attrs, info):
    x = t["x"]
    k = len(attrs["normalized_shape"])
    axes = tuple(range(x.ndim - k, x.ndim))
    inv = 1.0 / np.sqrt((x**2).mean(axis=axes, keepdims=True) + 1e-6)
    return {"y": x * inv * t["weight"], "inv_rms": inv.reshape(x.shape[: x.ndim - k])}


@kernel("rms_norm_grad")
def _rms_norm_grad(t, attrs, info):
    dy, x, w = t["dy"], t["x"], t["weight"]
    inv = _expand_stats(t["inv_rms"], x.ndim)
    axes = tuple(range(t["inv_rms"].ndim, x.ndim))
    n = math.prod(x.shape[a] for a in axes)
    g = dy * w
    dx = inv * g - x * inv**3 * (g * x).sum(axis=axes, keepdims=True) / n
    return {"dx": dx}


@kernel("rms_norm_param_grad")
def _rms_param_grad(t, attrs, info):
    dy, x = t["dy"], t["x"]
    inv = _expand_stats(t["inv_rms"], x.ndim)
    rows = tuple(range(t["inv_rms"].ndim))
    return {"weight_grad": (dy * x * inv).sum(axis=rows)}


@kernel("bias_add")
def _bias_add(t, attrs, info):
    a, b = t["a"], t["b"]
    axis = attrs["axis"]
    shape = [1] * a.ndim
    shape[axis] = b.shape[0]
    return {"out": a + b.reshape(shape)}


# ---- embedding and losses (offset-aware: the vocab-parallel kernels)


@kernel("gather")
def _gather(t, attrs, info):
    table, ids = t["in"], t["indices"].astype(np.int64)
    start = info.offsets["in"][0]
    local = ids - start
    hit = (local >= 0) & (local < table.shape[0])
    out = table[np.clip(local, 0, table.shape[0] - 1)]
    return {"out": np.where(hit[..., None], out, 0.0)}


@kernel("unsorted_segment_sum_like")
def _segment_sum_like(t, attrs, info):
    data, ids, like = t["data"], t["segment_ids"].astype(np.int64), t["like"]
    start = info.offsets["like"][0]
    out = np.zeros(like.shape)
    local = ids - start
    hit = (local >= 0) & (local < like.shape[0])
    np.add.at(out, local[hit], data[hit])
    return {"out": out}


@kernel("sparse_softmax_cross_entropy_grad", "sparse_softmax_cross_entropy_ms_grad")
def _ssce_grad(t, attrs, info):
    label, dy, prob = t["label"].astype(np.int64), t["dy"], t["prob"]
    start = info.offsets["prob"][-1]
    onehot = (np.arange(prob.shape[-1]) + start == label[..., None]).astype(np.float64)
    return {"prediction_diff": dy[..., None] * (prob - onehot)}


@kernel("sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_ms")
def _ssce(t, attrs, info):
    pred, label = t["prediction"], t["label"].astype(np.int64)
    prob = _softmax(pred)
    out = -np.log(np.take_along_axis(prob, label[..., None], axis=-1))[..., 0]
    return {"prob": prob, "out": out}


@kernel("nll")
def _nll(t, attrs, info):
    x, target, w = t["input"], t["target"].astype(np.int64), t["weight"]
    start = info.offsets["input"][1]
    local = target - start
    hit = (local >= 0) & (local < x.shape[1])
    safe = np.clip(local, 0, x.shape[1] - 1)
    wt = np.where(hit, w[safe], 0.0)
    picked = np.where(hit, x[np.arange(x.shape[0]), safe], 0.0)
    return {"output": -picked * wt, "out_weight": wt}


@kernel("nll_grad")
def _nll_grad(t, attrs, info):
    g, x, target, w = t["out_grad"], t["input"], t["target"].astype(np.int64), t["weight"]
    start = info.offsets["input"][1]
    local = target - start
    hit = (local >= 0) & (local < x.shape[1])
    safe = np.clip(local, 0, x.shape[1] - 1)
    out = np.zeros(x.shape)
    rows = np.arange(x.shape[0])[hit]
    out[rows, safe[hit]] = -g[hit] * w[safe[hit]]
    return {"in_grad": out}
