"""The training iteration a request asks for: K micro-batches per optimizer step and activation
checkpointing (:class:`TrainingConfig`), as plans and requests record it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from autopar.errors import ConfigError

__all__ = ["CHECKPOINTING_MODES", "TrainingConfig", "micro_batches_text"]

CHECKPOINTING_MODES = ("off", "full", "selective", "auto")
"""``off``: keep every activation; ``full``: recompute every transformer block (Megatron's
``--recompute-granularity full`` and LiBai's ``actrue``); ``selective``: recompute every
block's attention core (Megatron-LM's ``--recompute-activations``, which sets
``recompute_granularity = 'selective'``: megatron/training/arguments.py); ``auto``: the units
the plan records (:attr:`TrainingConfig.recomputed`: blocks, or op groups of a block such as
``layers.3::attention_core``, :mod:`autopar.ir.blocks`), chosen by the solver jointly with the
layout, or named by a baseline (Megatron-LM's ``--recompute-method block
--recompute-num-layers N``)."""


@dataclass(frozen=True)
class TrainingConfig:
    """The job's training configuration: micro-batches per optimizer step and checkpointing.

    Raises :class:`ConfigError` (a ``ValueError``; codes ``bad_micro_batches``,
    ``bad_checkpointing``) naming the value."""

    micro_batches: int = 1
    checkpointing: str = "off"
    recomputed: tuple[str, ...] = ()
    """Under ``auto``: the units the plan recomputes, sorted: blocks (layer scopes,
    :func:`autopar.ir.blocks.layer_of`) and op groups of blocks
    (:func:`autopar.ir.blocks.group_unit`); the solver's choice, empty in a request.  Empty
    under ``off``, ``full`` and ``selective``."""

    def __post_init__(self) -> None:
        k = self.micro_batches
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(
                "bad_micro_batches",
                f"micro-batches per optimizer step must be an integer >= 1, got {k!r}",
            )
        if self.checkpointing not in CHECKPOINTING_MODES:
            raise ConfigError(
                "bad_checkpointing",
                f"checkpointing must be one of {', '.join(CHECKPOINTING_MODES)}, got {self.checkpointing!r}",
            )
        blocks = self.recomputed
        if isinstance(blocks, str) or not all(isinstance(b, str) for b in blocks):
            raise ConfigError("bad_checkpointing", f"recomputed blocks must be names, got {blocks!r}")
        if blocks and self.checkpointing != "auto":
            raise ConfigError(
                "bad_checkpointing",
                f"recomputed blocks are chosen under checkpointing 'auto' only, not {self.checkpointing!r}",
            )
        object.__setattr__(self, "recomputed", tuple(sorted(set(blocks))))

    @property
    def is_default(self) -> bool:
        """One micro-batch per step, nothing recomputed: the step priced before iterations."""
        return self.micro_batches == 1 and self.checkpointing == "off"

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"micro_batches": self.micro_batches, "checkpointing": self.checkpointing}
        if self.checkpointing == "auto":
            out["recomputed_blocks"] = list(self.recomputed)
        return out

    def repriced(self, micro_batches: int | None, checkpointing: str | None) -> TrainingConfig:
        """This plan's configuration at another K or checkpointing (None: keep this one's).
        ``auto`` keeps the blocks this configuration records (a plan solved with ``auto``
        recomputes what the solver chose; any other plan records none)."""
        mode = self.checkpointing if checkpointing is None else checkpointing
        k = self.micro_batches if micro_batches is None else micro_batches
        blocks = self.recomputed if mode == "auto" else ()
        return TrainingConfig(k, mode, blocks)

    def with_recomputed(self, blocks: Iterable[str]) -> TrainingConfig:
        """This configuration with ``blocks`` recomputed (the solver's choice under ``auto``)."""
        return dataclasses.replace(self, recomputed=tuple(sorted(set(blocks))))


def micro_batches_text(k: int) -> str:
    """``1 micro-batch``, ``8 micro-batches``: ``k`` with the noun in its number."""
    return f"{k} micro-batch" if k == 1 else f"{k} micro-batches"
