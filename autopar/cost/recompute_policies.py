"""What a block may recompute: its recompute policies under a runtime.

Under checkpointing ``auto`` each transformer block (:func:`autopar.cost.iteration.candidate_blocks`)
gets one policy, chosen by the solver jointly with the layout:

* ``off`` -- the block keeps every activation;
* each non-empty set of the runtime's :attr:`~autopar.runtimes.profile.RuntimeProfile.recompute_groups`
  that the runtime can run: the op groups (:mod:`autopar.ir.blocks`) recomputed in backward
  from the tensors they read, the rest of the block kept (Megatron-Core's
  ``--recompute-granularity selective --recompute-modules core_attn layernorm``);
* ``full`` -- the whole block recomputed from its input (``--recompute-granularity full``).

A runtime whose checkpointing is per block only (OneFlow 0.9: ``activation_checkpointing`` on
a module, and the groups are no modules of the jobs it runs) has the two policies ``off`` and
``full``.  What the policies cost and free is priced by the evaluator from the units they
recompute (:func:`policy_units`; :func:`autopar.cost.activation_spans.activation_spans`,
:func:`autopar.cost.iteration.run_counts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import combinations

from autopar.ir.blocks import GROUPS, group_unit, split_unit
from autopar.runtimes.profile import RuntimeProfile

__all__ = ["FULL", "OFF", "BlockPolicy", "block_policies", "block_policy_of", "policy_units"]


@dataclass(frozen=True)
class BlockPolicy:
    """What one block recomputes: nothing, some of its op groups, or all of it."""

    name: str
    groups: frozenset[str]
    """The op groups recomputed (empty for ``off`` and ``full``)."""
    whole: bool = False
    """The whole block is recomputed (``full``)."""

    @property
    def recomputes(self) -> bool:
        return self.whole or bool(self.groups)

    def units(self, block: str) -> frozenset[str]:
        """The units ``block`` recomputes under this policy: the block, or its group units."""
        if self.whole:
            return frozenset({block})
        return frozenset(group_unit(block, g) for g in self.groups)


OFF = BlockPolicy("off", frozenset())
FULL = BlockPolicy("full", frozenset(), whole=True)


def block_policies(runtime: RuntimeProfile) -> tuple[BlockPolicy, ...]:
    """The policies a block may take under ``runtime``: ``off``, every non-empty set of its
    recompute groups (fewest groups first, in :data:`autopar.ir.blocks.GROUPS` order), then
    ``full``.  ``off`` is index 0 and ``full`` the last."""
    groups = [g for g in GROUPS if g in runtime.recompute_groups]
    subsets = [
        BlockPolicy("+".join(chosen), frozenset(chosen))
        for size in range(1, len(groups) + 1)
        for chosen in combinations(groups, size)
    ]
    return (OFF, *subsets, FULL)


def policy_units(policies: dict[str, BlockPolicy]) -> frozenset[str]:
    """The units recomputed when each block takes its policy (block -> policy)."""
    return frozenset(u for block, policy in policies.items() for u in policy.units(block))


def block_policy_of(
    block: str, units: Iterable[str], policies: tuple[BlockPolicy, ...]
) -> BlockPolicy | None:
    """The policy of ``policies`` under which ``block`` recomputes exactly its units among
    ``units``; None when no policy does (a plan recomputing groups the runtime cannot)."""
    own = frozenset(u for u in units if split_unit(u)[0] == block)
    for policy in policies:
        if policy.units(block) == own:
            return policy
    return None
