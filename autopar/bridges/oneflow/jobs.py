"""Build OneFlow training jobs and read their ``Job`` protobuf.

``make_train_graph(module, optimizer)`` wraps a module whose ``forward`` returns
the loss in an ``nn.Graph`` that runs forward, backward and the optimizer;
``export_job(graph, *inputs)`` builds it (OneFlow's autograd, optimizer, ZeRO and
auto-parallel passes) without compiling or running it and returns the ``Job``
bytes that :func:`autopar.bridges.oneflow.import_job` reads.  ``load_job`` parses bytes,
a file path or a ``Job`` message.

OneFlow is imported inside the functions: importing this module never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autopar.errors import ConfigError, GraphError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import oneflow

__all__ = ["export_job", "load_job", "make_train_graph", "oneflow_version"]


def _require_oneflow() -> Any:
    try:
        import oneflow
    except ImportError as exc:  # the bridge runs in the OneFlow venv only
        raise ConfigError(
            "oneflow_missing",
            f"OneFlow is not importable here ({exc}); run this in the OneFlow venv made by "
            "scripts/oneflow-env.sh (Python 3.10, oneflow 0.9.0)",
        ) from None
    return oneflow


def oneflow_version() -> str:
    """The installed OneFlow version (raises ConfigError when OneFlow is missing)."""
    return str(_require_oneflow().__version__)


def make_train_graph(
    module: oneflow.nn.Module,
    optimizer: oneflow.optim.Optimizer,
    *,
    zero_stage: int = 0,
    zero_min_size: int = 1024,
    auto_parallel: bool = False,
    auto_parallel_ignore_user_sbp: bool = False,
    amp: bool = False,
    micro_batches: int = 1,
    checkpointing: Iterable[str] = (),
) -> oneflow.nn.Graph:
    """An ``nn.Graph`` running ``loss = module(*inputs); loss.backward()`` and ``optimizer``.

    ``zero_stage`` 1-3 enables OneFlow's ZeRO (``enable_zero(stage=...)``; states of
    tensors with fewer than ``zero_min_size`` elements per shard stay whole);
    ``auto_parallel`` runs OneFlow's own SBP search when the job is built.
    ``micro_batches`` > 1 accumulates gradients over that many micro-batches per step
    (``config.set_gradient_accumulation_steps``: each input then holds ``K`` micro-batches);
    ``checkpointing`` names module paths (``h.0``) to recompute in backward
    (``activation_checkpointing``; :func:`autopar.bridges.oneflow.iteration.configure_iteration`).
    """
    from autopar.bridges.oneflow.iteration import configure_iteration

    flow = _require_oneflow()
    paths = list(checkpointing)
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError("bad_zero_stage", f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")

    class TrainGraph(flow.nn.Graph):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = module
            self.add_optimizer(optimizer)
            if zero_stage:
                self.config.enable_zero(True, stage=zero_stage, shard_min_size=zero_min_size)
            if auto_parallel:
                self.config.enable_auto_parallel(True)
                if auto_parallel_ignore_user_sbp:
                    self.config.enable_auto_parallel_ignore_user_sbp_config(True)
            if amp:
                self.config.enable_amp(True)
            configure_iteration(self, micro_batches, paths, "model")

        def build(self, *inputs: Any) -> Any:
            loss = self.model(*inputs)
            loss.backward()
            return loss

    return TrainGraph()


def export_job(graph: oneflow.nn.Graph, *inputs: Any) -> bytes:
    """Build ``graph`` on ``inputs`` (if not built yet) and return its full ``Job`` protobuf bytes.

    The job holds forward, backward and optimizer ops and the N-D SBP OneFlow
    chose for every op (``job_parallel_view_conf``); nothing is compiled or run.
    """
    if graph._full_job_proto is None:
        graph.build_graph(*inputs)
    return bytes(graph._full_job_proto.SerializeToString())


def load_job(job: Any) -> Any:
    """A OneFlow ``Job`` message from a ``Job``, its serialized bytes, or a path to a ``.pb`` file."""
    _require_oneflow()
    from oneflow.core.job import job_pb2

    if isinstance(job, job_pb2.Job):
        return job
    if isinstance(job, (str, os.PathLike)):
        try:
            with open(job, "rb") as fh:
                job = fh.read()
        except OSError as exc:
            raise GraphError("unreadable_job", f"cannot read OneFlow job file {job!s}: {exc}") from None
    if isinstance(job, (bytes, bytearray, memoryview)):
        from google.protobuf.message import DecodeError

        message = job_pb2.Job()
        try:
            message.ParseFromString(bytes(job))
        except (DecodeError, SystemError) as exc:  # protobuf's C++ backend wraps DecodeError
            raise GraphError(
                "bad_job", f"not a OneFlow Job protobuf ({exc}); export it with graph._full_job_proto"
            ) from None
        if not message.net.op:
            raise GraphError("bad_job", "the OneFlow job has no ops; build the graph before exporting it")
        return message
    raise GraphError("bad_job", f"expected a OneFlow Job, its bytes or a file path, got {type(job).__name__}")
