"""The batch one graph computes: samples per micro-batch and, for a sequence model, tokens.

A graph is one micro-batch of the whole job (every data-parallel rank's share together), so
an optimizer step of ``K`` micro-batches trains ``K x samples`` samples.  The figures come from
a built model's ``meta["config"]`` (``batch``, ``seq`` or an encoder's ``encoder_seq``), else
from the shapes of the graph's ``input`` ops (an imported job): the batch is the first dim most
of them share, the sequence the second dim of the two-dim token inputs of that batch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autopar.ir.graph import Graph

__all__ = ["BatchShape", "batch_shape"]


@dataclass(frozen=True)
class BatchShape:
    """Samples per micro-batch, and the sequence length when the graph's inputs have one."""

    samples: int
    sequence: int | None = None

    @property
    def tokens(self) -> int | None:
        """Tokens per micro-batch (samples x sequence); None without a sequence."""
        return None if self.sequence is None else self.samples * self.sequence

    def throughput_text(self, micro_batches: int, iteration_s: float) -> str:
        """``1,234 samples/s, 39,488 tokens/s`` for ``micro_batches`` micro-batches in
        ``iteration_s`` seconds (``n/a`` for a time that is not positive)."""
        if not iteration_s > 0:
            return "n/a"
        per_s = micro_batches / iteration_s
        text = f"{self.samples * per_s:,.0f} samples/s"
        if self.tokens is not None:
            text += f", {self.tokens * per_s:,.0f} tokens/s"
        return text


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def batch_shape(graph: Graph) -> BatchShape | None:
    """The batch of one micro-batch of ``graph`` (module docstring); None when neither the
    model's configuration nor the inputs' shapes say it."""
    config = (graph.meta or {}).get("config") or {}
    samples = _positive(config.get("batch"))
    if samples is not None:
        sequence = _positive(config.get("seq")) or _positive(config.get("encoder_seq"))
        return BatchShape(samples, sequence)
    shapes = [
        graph.tensors[t].shape
        for op in graph.ops
        if op.type == "input" and not op.inputs
        for t in op.outputs.values()
        if graph.tensors[t].ndim >= 1
    ]
    firsts = Counter(s[0] for s in shapes if s[0] > 0)
    if not firsts:
        return None
    samples = firsts.most_common(1)[0][0]
    sequences = Counter(s[1] for s in shapes if len(s) == 2 and s[0] == samples and s[1] > 1)
    return BatchShape(samples, sequences.most_common(1)[0][0] if sequences else None)
