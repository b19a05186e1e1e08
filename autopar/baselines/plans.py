"""Reference plans autopar must beat (BRIEF section 5).

* ``megatron``: the hand-written dp x tp layout.  Parameters laid out as
  Megatron does (column-parallel / row-parallel / vocab-parallel, recognised
  from the graph's structure, not from names); data ``S(0)`` on the dp axis;
  every other op takes, in topological order, the signature with the least
  input boxing plus compute, where a partial sum (``P``) may only come out of a
  tensor-parallel matmul or flow towards a weight gradient, so partial sums are
  all-reduced as soon as they are used, as in Megatron: one all-reduce per
  Megatron linear's input gradient (fused QKV, key/value, gated fc1), so a partial
  sum of input gradients completes at most one linear before it is all-reduced
  (:meth:`_GreedyWalk._completes_one_linear`); constants are computed
  whole on every rank; weight gradients keep their parameter's
  tensor-parallel layout; nothing is split on the tensor-parallel axis but
  what a tensor-parallel parameter's split reaches (no sequence parallelism).
  Its plans are built and evaluated with Megatron-LM's rules
  (:mod:`autopar.rules.megatron_lm`): a vocab-parallel cross-entropy written as
  ``log_softmax`` + ``nll``, and a fused q/k/v output split by heads.
* ``inferred``: OneFlow's SBP inference as LiBai uses it: the same parameter
  layout, and every other op picks, in topological order, what OneFlow 0.9's
  greedy inference picks (:mod:`autopar.baselines.oneflow_inference`: its candidate
  order, its copy cost and tie-breaks; 99 % of op signatures as OneFlow's own
  on the jobs of ``benchmarks/fidelity.py``).
* ``data-parallel``: parameters ``B``, data ``S(0)`` on every axis, greedy as
  ``megatron``.
* ``single-device``: every op replicated (all ``B``): each device does the work of one.

The mesh's last axis is tensor-parallel when the mesh has two or more axes;
the others are data-parallel.
"""

from __future__ import annotations

from autopar.baselines.data_parallel import DataParallelBaseline
from autopar.baselines.megatron.layout import MegatronBaseline
from autopar.baselines.oneflow_inference import InferredBaseline
from autopar.baselines.problem import BASELINES, Baseline, BaselineKind, _Problem
from autopar.baselines.single_device import SingleDeviceBaseline
from autopar.errors import ConfigError
from autopar.hardware.mesh import Mesh
from autopar.ir.graph import Graph
from autopar.ir.plan import Plan
from autopar.ir.wire import DEFAULT_RUNTIME
from autopar.rules.megatron_lm import rules_for_source
from autopar.rules.registry import RuleSet

__all__ = ["baseline_plan"]


STRATEGIES: dict[BaselineKind, Baseline] = {
    s.kind: s
    for s in (MegatronBaseline(), InferredBaseline(), DataParallelBaseline(), SingleDeviceBaseline())
}
"""Each baseline's strategy, by kind."""


def baseline_plan(
    kind: str | BaselineKind,
    graph: Graph,
    mesh: Mesh,
    zero_stage: int = 0,
    *,
    rules: RuleSet | None = None,
    runtime: str = DEFAULT_RUNTIME,
    sequence_parallel: bool = False,
) -> Plan:
    """Build the ``kind`` baseline plan of ``graph`` on ``mesh`` (signatures only; evaluate it next).

    ``sequence_parallel``: Megatron-LM's ``--sequence-parallel`` (``megatron`` only, on a mesh
    with a tensor-parallel axis of more than one device).

    Boxing is priced as ``runtime`` lowers it (:mod:`autopar.runtimes.profile`).  ``rules`` None:
    the rules the plan's source is evaluated with (:func:`autopar.rules.megatron_lm.rules_for_source`:
    Megatron-LM's vocab-parallel cross-entropy for ``megatron``, OneFlow's otherwise).
    """
    try:
        kind = BaselineKind(kind)
    except ValueError:
        raise ConfigError(
            "unknown_baseline", f"unknown baseline {kind!r}; choose one of {BASELINES}"
        ) from None
    if sequence_parallel and (kind is not BaselineKind.MEGATRON or mesh.ndim < 2 or mesh.shape[-1] < 2):
        raise ConfigError(
            "bad_baseline_config",
            "sequence parallelism splits the sequence over Megatron-LM's tensor-parallel group: "
            f"it needs the megatron baseline with tp > 1, not {kind.value} on mesh {list(mesh.shape)}",
        )
    rules = rules or rules_for_source(f"baseline:{kind.value}")
    problem = _Problem(graph, mesh, zero_stage, rules, runtime, sequence_parallel)
    return STRATEGIES[kind].plan(problem)
