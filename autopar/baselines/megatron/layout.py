"""Megatron-LM's dp x tp layout as a baseline: its parameters laid out as Megatron does
(:mod:`autopar.runtimes.megatron_lm.linears`), data split on the data-parallel axes, every
other op by the greedy walk (:class:`MegatronBaseline`); Megatron-LM's refusal of a
tensor-parallel degree that does not divide the heads.
"""

from __future__ import annotations

from autopar.baselines.greedy_walk import _GreedyWalk
from autopar.baselines.problem import Baseline, BaselineKind, _Layout, _Problem
from autopar.errors import ConfigError
from autopar.ir.sbp import B, NdSbp, S, Signature
from autopar.ir.structure import _structure
from autopar.runtimes.megatron_lm.linears import _megatron_layout


class MegatronBaseline(Baseline):
    """Megatron-LM's dp x tp layout; every other op greedy under its discipline (module docstring)."""

    kind = BaselineKind.MEGATRON

    def signatures(self, problem: _Problem) -> dict[str, Signature]:
        _check_heads_divide(problem)
        return _GreedyWalk(problem, _libai_layout(problem), _structure(problem.graph), megatron=True).run()


def _check_heads_divide(problem: _Problem) -> None:
    """Megatron-LM gives every tensor-parallel rank the same number of attention heads and
    refuses a degree that does not divide them (``num_attention_heads_per_partition =
    divide(num_attention_heads, world_size)``, megatron/core/transformer/attention.py;
    ``ensure_divisibility``, megatron/core/utils.py).  Checked where the graph says its
    heads (a built model's ``meta["config"]["heads"]``); an imported job's layout splits
    what its shapes allow."""
    tp_axis = problem.tp_axis
    heads = ((problem.graph.meta or {}).get("config") or {}).get("heads")
    if tp_axis is None or not isinstance(heads, int) or heads <= 0:
        return
    tp = problem.mesh.shape[tp_axis]
    if heads % tp:
        fits = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise ConfigError(
            "megatron_heads_split",
            f"Megatron-LM cannot split {heads} attention heads over a tensor-parallel degree of {tp} "
            f"(megatron/core/transformer/attention.py divides the heads evenly): use a tensor-parallel "
            f"degree (the mesh's last axis) that divides {heads}: one of {fits}",
        )


def _libai_layout(problem: _Problem) -> _Layout:
    """Megatron's (and LiBai's) parameter layout, data ``S(0)`` on the data-parallel axes."""
    variables, fused = _megatron_layout(problem.graph, problem.mesh)
    tp = problem.tp_axis
    data = NdSbp(tuple(B if a == tp else S(0) for a in range(problem.mesh.ndim)))
    return _Layout(variables, data, fused)
