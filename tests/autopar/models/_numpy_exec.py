"""A float64 numpy interpreter of autopar graphs, for checking the model builders' backward.

Every float tensor is computed in float64 whatever its declared dtype (casts are
identities), so finite differences of the forward loss can be compared with the
gradients the graph's own backward ops compute.  Dropout masks are fixed per op
(seeded by the op name) so repeated forward passes see the same mask.

The kernels follow OneFlow's op semantics (ports ``a_0``, ``x_0`` ...; attrs
``transpose_a``, ``alpha``, ``axis`` ...) and are written independently of the
builder.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping

import numpy as np

from autopar.ir.graph import Graph, Op, Role

Arrays = dict[str, np.ndarray]
Kernel = Callable[[Op, Arrays], Arrays]

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _mm(a: np.ndarray, b: np.ndarray, attrs: Mapping[str, object]) -> np.ndarray:
    if attrs.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    return float(attrs.get("alpha", 1.0)) * np.matmul(a, b)  # type: ignore[arg-type]


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_grad(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return dy * (cdf + x * pdf)


_C = math.sqrt(2.0 / math.pi)


def _fast_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_C * (x + 0.044715 * x**3)))


def _fast_gelu_grad(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    t = np.tanh(_C * (x + 0.044715 * x**3))
    dt = (1.0 - t * t) * _C * (1.0 + 3 * 0.044715 * x * x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * dt)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _dropout_mask(op: Op, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(op.name.encode()))
    return rng.random(shape) >= float(op.attrs["rate"])


def _k(fn: Callable[..., np.ndarray], *ports: str, out: str = "out_0") -> Kernel:
    def kernel(op: Op, x: Arrays) -> Arrays:
        return {out: fn(*(x[p] for p in ports))}

    return kernel


def _rms_norm(op: Op, x: Arrays) -> Arrays:
    v = x["x_0"]
    inv = 1.0 / np.sqrt((v * v).mean(axis=-1) + float(op.attrs["epsilon"]))
    return {"y_0": v * inv[..., None] * x["weight_0"], "inv_rms_0": inv}


def _rms_norm_grad(op: Op, x: Arrays) -> Arrays:
    inv = x["inv_rms_0"][..., None]
    n = x["x_0"] * inv
    dn = x["dy_0"] * x["weight_0"]
    return {"dx_0": inv * (dn - n * (dn * n).mean(axis=-1, keepdims=True))}


def _rms_norm_param_grad(op: Op, x: Arrays) -> Arrays:
    n = x["x_0"] * x["inv_rms_0"][..., None]
    g = x["dy_0"] * n
    return {"weight_grad_0": g.reshape(-1, g.shape[-1]).sum(axis=0)}


def _layer_norm(op: Op, x: Arrays) -> Arrays:
    v = x["x_0"]
    mean = v.mean(axis=-1)
    inv = 1.0 / np.sqrt(v.var(axis=-1) + float(op.attrs["epsilon"]))
    xhat = (v - mean[..., None]) * inv[..., None]
    return {"y_0": xhat * x["gamma_0"] + x["beta_0"], "mean_0": mean, "inv_variance_0": inv}


def _xhat(x: Arrays) -> np.ndarray:
    return (x["x_0"] - x["mean_0"][..., None]) * x["inv_variance_0"][..., None]


def _layer_norm_grad(op: Op, x: Arrays) -> Arrays:
    xhat = _xhat(x)
    d = x["dy_0"] * x["gamma_0"]
    inv = x["inv_variance_0"][..., None]
    dx = inv * (d - d.mean(axis=-1, keepdims=True) - xhat * (d * xhat).mean(axis=-1, keepdims=True))
    return {"dx_0": dx}


def _layer_norm_param_grad(op: Op, x: Arrays) -> Arrays:
    dy = x["dy_0"]
    h = dy.shape[-1]
    return {
        "beta_diff_0": dy.reshape(-1, h).sum(axis=0),
        "gamma_diff_0": (dy * _xhat(x)).reshape(-1, h).sum(axis=0),
    }


def _unsorted_segment_sum_like(op: Op, x: Arrays) -> Arrays:
    out = np.zeros_like(x["like_0"], dtype=np.float64)
    ids = x["segment_ids_0"].reshape(-1)
    data = x["data_0"].reshape(ids.size, *out.shape[1:])
    np.add.at(out, ids, data)
    return {"out_0": out}


def _broadcast_like(op: Op, x: Arrays) -> Arrays:
    v, like = x["x_0"], x["like_0"]
    axes = list(op.attrs["broadcast_axes"])
    if v.ndim < like.ndim:
        v = np.expand_dims(v, axes)
    return {"y_0": np.broadcast_to(v, like.shape).copy()}


def _reduce_sum_like(op: Op, x: Arrays) -> Arrays:
    s = x["x_0"].sum(axis=tuple(op.attrs["axis"]))
    return {"y_0": s.reshape(x["like_0"].shape)}


def _sparse_ce(op: Op, x: Arrays) -> Arrays:
    prob = _softmax(x["prediction_0"])
    lab = x["label_0"].astype(np.int64)
    return {"prob_0": prob, "out_0": -np.log(prob[np.arange(lab.size), lab])}


def _sparse_ce_grad(op: Op, x: Arrays) -> Arrays:
    d = x["prob_0"].copy()
    lab = x["label_0"].astype(np.int64)
    d[np.arange(lab.size), lab] -= 1.0
    return {"prediction_diff_0": d * x["dy_0"][:, None]}


def _dropout(op: Op, x: Arrays) -> Arrays:
    v = x["in_0"]
    mask = _dropout_mask(op, v.shape)
    return {"out_0": v * mask / (1.0 - float(op.attrs["rate"])), "mask_0": mask}


def _narrow_index(op: Op, ndim: int) -> tuple[slice, ...]:
    dim, start = int(op.attrs["dim"]), int(op.attrs["start"])
    cut = slice(start, start + int(op.attrs["length"]))
    return tuple(cut if d == dim else slice(None) for d in range(ndim))


def _narrow_grad(op: Op, x: Arrays) -> Arrays:
    """``dy`` written into zeros shaped like ``like`` at the narrowed range."""
    dx = np.zeros_like(x["like_0"], dtype=np.float64)
    dx[_narrow_index(op, dx.ndim)] = x["dy_0"]
    return {"dx_0": dx}


KERNELS: dict[str, Kernel] = {
    "narrow": lambda op, x: {"out_0": x["in_0"][_narrow_index(op, x["in_0"].ndim)]},
    "narrow_grad": _narrow_grad,
    "cast": _k(lambda v: v, "in_0"),
    "reshape": lambda op, x: {"out_0": x["in_0"].reshape(op.attrs["shape"])},
    "transpose": lambda op, x: {"output_0": np.transpose(x["input_0"], op.attrs["perm"])},
    "add_n": lambda op, x: {"out_0": np.sum([x[p] for p in op.inputs], axis=0)},
    "broadcast_add": _k(np.add, "x_0", "y_0", out="z_0"),
    "broadcast_mul": _k(np.multiply, "x_0", "y_0", out="z_0"),
    "scalar_mul": lambda op, x: {"out_0": x["in_0"] * float(op.attrs["float_operand"])},
    "scalar_add": lambda op, x: {"out_0": x["in_0"] + float(op.attrs["float_operand"])},
    "scalar_pow": lambda op, x: {"out_0": x["in_0"] ** float(op.attrs["float_operand"])},
    "reciprocal_no_nan": lambda op, x: {"y_0": np.where(x["x_0"] == 0, 0.0, 1.0 / x["x_0"])},
    "clip_by_scalar_max": lambda op, x: {"y_0": np.minimum(x["x_0"], float(op.attrs["floating_max"]))},
    "scalar_mul_by_tensor": lambda op, x: {"y_0": x["x_0"] * x["scalar_0"]},
    "multi_reduce_sum_pow_abs": lambda op, x: {
        "y_0": np.asarray(np.sum([np.sum(np.abs(x[p]) ** float(op.attrs["p"])) for p in op.inputs]))
    },
    "ones_like": lambda op, x: {"out_0": np.ones_like(x["like_0"], dtype=np.float64)},
    "softmax": _k(_softmax, "in_0"),
    "softmax_grad": lambda op, x: {
        "dx_0": x["y_0"] * (x["dy_0"] - (x["dy_0"] * x["y_0"]).sum(axis=-1, keepdims=True))
    },
    "dropout": _dropout,
    "dropout_grad": lambda op, x: {"dx_0": x["dy_0"] * x["mask_0"] * float(op.attrs["scale"])},
    "gelu": _k(_gelu, "in_0"),
    "gelu_grad": _k(_gelu_grad, "x_0", "dy_0", out="dx_0"),
    "fast_gelu": _k(_fast_gelu, "in_0"),
    "fast_gelu_grad": _k(_fast_gelu_grad, "dy_0", "x_0", out="dx_0"),
    "matmul": lambda op, x: {"out_0": _mm(x["a_0"], x["b_0"], op.attrs)},
    "batch_matmul": lambda op, x: {"out_0": _mm(x["a_0"], x["b_0"], op.attrs)},
    "broadcast_matmul": lambda op, x: {"out_0": _mm(x["a_0"], x["b_0"], op.attrs)},
    "broadcast_matmul_grad_b": lambda op, x: {
        "out_0": float(op.attrs["alpha"])
        * x["a_0"].reshape(-1, x["a_0"].shape[-1]).T
        @ x["b_0"].reshape(-1, x["b_0"].shape[-1])
    },
    "rms_norm": _rms_norm,
    "rms_norm_grad": _rms_norm_grad,
    "rms_norm_param_grad": _rms_norm_param_grad,
    "layer_norm": _layer_norm,
    "layer_norm_grad": _layer_norm_grad,
    "layer_norm_param_grad": _layer_norm_param_grad,
    "gather": lambda op, x: {"out_0": np.take(x["in_0"], x["indices_0"].astype(np.int64), axis=0)},
    "unsorted_segment_sum_like": _unsorted_segment_sum_like,
    "reduce_sum": lambda op, x: {
        "output_tensor_0": x["input_tensor_0"].sum(
            axis=tuple(op.attrs["axis"]), keepdims=bool(op.attrs["keepdims"])
        )
    },
    "broadcast_like": _broadcast_like,
    "reduce_sum_like": _reduce_sum_like,
    "sparse_softmax_cross_entropy": _sparse_ce,
    "sparse_softmax_cross_entropy_grad": _sparse_ce_grad,
}


class NumpyExecutor:
    """Run a graph's ops in topological order with float64 numpy kernels."""

    def __init__(
        self, graph: Graph, feeds: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]
    ) -> None:
        self.graph = graph
        self.feeds = dict(feeds)
        self.params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
        self.order = graph.topological_order

    def run(
        self,
        roles: frozenset[Role] = frozenset(Role),
        params: Mapping[str, np.ndarray] | None = None,
    ) -> Arrays:
        """Values of every tensor produced by ops of ``roles`` (variables and inputs always run)."""
        values: Arrays = {}
        current = {**self.params, **(params or {})}
        for op in self.order:
            if op.type == "variable":
                values[op.outputs["out"]] = current[op.name]
                continue
            if op.type == "input":
                values[op.outputs["out"]] = self.feeds[op.name]
                continue
            if op.role not in roles or op.type == "adam_update":
                continue
            args = {port: values[t] for port, t in op.inputs.items()}
            outs = KERNELS[op.type](op, args)
            for port, tensor in op.outputs.items():
                arr = np.asarray(outs[port])
                spec = self.graph.tensors[tensor]
                if arr.shape != spec.shape:
                    raise AssertionError(
                        f"{op.name} ({op.type}) port {port}: computed shape {arr.shape}, "
                        f"declared {spec.shape}"
                    )
                values[tensor] = arr
        return values


def random_feeds(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Plausible values for every ``input`` op: ids within their table, masks, biases."""
    vocab = int(graph.meta.get("padded_vocab", 2))
    cfg = graph.meta.get("config", {})
    feeds: dict[str, np.ndarray] = {}
    for op in graph.ops:
        if op.type != "input":
            continue
        spec = graph.tensors[op.outputs["out"]]
        if op.name.endswith("position_buckets"):
            feeds[op.name] = rng.integers(0, int(cfg["relative_attention_buckets"]), spec.shape)
        elif op.name.endswith("position_ids"):
            feeds[op.name] = np.broadcast_to(np.arange(spec.shape[-1]), spec.shape).copy()
        elif op.name == "token_type_ids":
            feeds[op.name] = rng.integers(0, int(cfg["type_vocab"]), spec.shape)
        elif spec.dtype == "int64":
            feeds[op.name] = rng.integers(0, vocab, spec.shape)
        elif op.name == "loss_mask":
            feeds[op.name] = (rng.random(spec.shape) < 0.7).astype(np.float64)
        else:  # additive attention masks: 0 or -10000
            feeds[op.name] = np.where(rng.random(spec.shape) < 0.15, -10000.0, 0.0)
    return feeds


def random_params(graph: Graph, rng: np.random.Generator, std: float = 0.2) -> dict[str, np.ndarray]:
    """Random parameter values; norm weights around 1."""
    params: dict[str, np.ndarray] = {}
    for v in graph.variables:
        shape = graph.tensors[v.tensor].shape
        if v.op.endswith("norm.weight"):
            params[v.op] = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            params[v.op] = std * rng.standard_normal(shape)
    return params
