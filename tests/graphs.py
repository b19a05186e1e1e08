"""Small hand-written training graphs for tests (independent of autopar.models)."""

from __future__ import annotations

from autopar.ir.graph import Graph, Op, Role, TensorSpec, Variable


def mlp_graph(batch: int = 16, hidden: int = 1024, ffn: int = 4096, layers: int = 1) -> Graph:
    """``layers`` x (x @ W1^T -> gelu -> @ W2^T) with hand-written backward and Adam.

    Weights are OneFlow ``[out, in]`` (Linear) fp32 variables cast to fp16, as AMP does.
    """
    tensors: list[TensorSpec] = []
    ops: list[Op] = []
    variables: list[Variable] = []

    def t(name: str, shape: tuple[int, ...], dtype: str = "float16") -> str:
        tensors.append(TensorSpec(name, shape, dtype))
        return name

    def op(
        name: str, type_: str, ins: dict[str, str], outs: dict[str, str], role: Role = Role.FORWARD, **attrs
    ) -> None:
        ops.append(Op(name, type_, ins, outs, dict(attrs), role))

    def weight(name: str, shape: tuple[int, int]) -> tuple[str, str]:
        w = t(f"{name}/out", shape, "float32")
        op(name, "variable", {}, {"out": w})
        w16 = t(f"{name}_cast/out_0", shape)
        op(f"{name}_cast", "cast", {"in_0": w}, {"out_0": w16}, dtype="float16")
        return w, w16

    x = t("x/out", (batch, hidden))
    op("x", "input", {}, {"out": x})
    saved = []
    cur = x
    for i in range(layers):
        w1, w1h = weight(f"l{i}.w1", (ffn, hidden))
        w2, w2h = weight(f"l{i}.w2", (hidden, ffn))
        h = t(f"l{i}.fc1/out_0", (batch, ffn))
        op(
            f"l{i}.fc1",
            "matmul",
            {"a_0": cur, "b_0": w1h},
            {"out_0": h},
            transpose_a=False,
            transpose_b=True,
            alpha=1.0,
        )
        g = t(f"l{i}.gelu/out_0", (batch, ffn))
        op(f"l{i}.gelu", "gelu", {"in_0": h}, {"out_0": g})
        y = t(f"l{i}.fc2/out_0", (batch, hidden))
        op(
            f"l{i}.fc2",
            "matmul",
            {"a_0": g, "b_0": w2h},
            {"out_0": y},
            transpose_a=False,
            transpose_b=True,
            alpha=1.0,
        )
        saved.append((cur, w1, w1h, h, g, w2, w2h))
        cur = y
    dy = t("seed/out_0", (batch, hidden))
    op("seed", "ones_like", {"like_0": cur}, {"out_0": dy}, Role.BACKWARD)
    for i in reversed(range(layers)):
        inp, w1, w1h, h, g, w2, w2h = saved[i]
        dw2 = t(f"l{i}.fc2_dw/out_0", (hidden, ffn))
        op(
            f"l{i}.fc2_dw",
            "matmul",
            {"a_0": dy, "b_0": g},
            {"out_0": dw2},
            Role.BACKWARD,
            transpose_a=True,
            transpose_b=False,
            alpha=1.0,
        )
        dg = t(f"l{i}.fc2_dx/out_0", (batch, ffn))
        op(
            f"l{i}.fc2_dx",
            "matmul",
            {"a_0": dy, "b_0": w2h},
            {"out_0": dg},
            Role.BACKWARD,
            transpose_a=False,
            transpose_b=False,
            alpha=1.0,
        )
        dh = t(f"l{i}.gelu_grad/dx_0", (batch, ffn))
        op(f"l{i}.gelu_grad", "gelu_grad", {"x_0": h, "dy_0": dg}, {"dx_0": dh}, Role.BACKWARD)
        dw1 = t(f"l{i}.fc1_dw/out_0", (ffn, hidden))
        op(
            f"l{i}.fc1_dw",
            "matmul",
            {"a_0": dh, "b_0": inp},
            {"out_0": dw1},
            Role.BACKWARD,
            transpose_a=True,
            transpose_b=False,
            alpha=1.0,
        )
        if i > 0:
            dx = t(f"l{i}.fc1_dx/out_0", (batch, hidden))
            op(
                f"l{i}.fc1_dx",
                "matmul",
                {"a_0": dh, "b_0": w1h},
                {"out_0": dx},
                Role.BACKWARD,
                transpose_a=False,
                transpose_b=False,
                alpha=1.0,
            )
            dy = dx
        for w, dw, name in ((w1, dw1, f"l{i}.w1"), (w2, dw2, f"l{i}.w2")):
            shape = next(s.shape for s in tensors if s.name == w)
            g32 = t(f"{name}_grad_cast/out_0", shape, "float32")
            op(f"{name}_grad_cast", "cast", {"in_0": dw}, {"out_0": g32}, Role.BACKWARD, dtype="float32")
            op(
                f"{name}_adam",
                "adam_update",
                {"model_0": w, "model_diff_0": g32},
                {},
                Role.OPTIMIZER,
                beta1=0.9,
                beta2=0.999,
                epsilon=1e-8,
                weight_decay=0.01,
                do_bias_correction=True,
            )
            variables.append(Variable(name, w, g32, f"{name}_adam"))
    return Graph(f"mlp{layers}", tensors, ops, variables).validate()
