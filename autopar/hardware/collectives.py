"""The time of one collective on one mesh axis: pure functions of the bytes and the axis's link.

Ring algorithms (NCCL; Thakur et al. 2005), per device of a group of ``n``, ``T`` the bytes of
the tensor the group holds: all-gather and reduce-scatter send ``(n-1)/n T`` in ``n-1`` steps,
all-reduce ``2(n-1)/n T`` in ``2(n-1)``, all-to-all ``(n-1)/n^2 T``; a send/recv moves its
bytes once.  Each step pays the axis's latency (alpha), each byte its bandwidth (beta, or the
profile's measured fit for that collective: :meth:`AxisLink.alpha_beta`).
"""

from __future__ import annotations

from enum import Enum

from autopar.hardware.mesh import AxisLink

__all__ = [
    "Collective",
    "all_gather_time",
    "all_reduce_time",
    "all_to_all_time",
    "collective_bytes",
    "reduce_scatter_time",
    "send_recv_time",
]


class Collective(str, Enum):
    ALL_GATHER = "all-gather"
    ALL_REDUCE = "all-reduce"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    SEND_RECV = "send-recv"
    LOCAL = "local"


# ------------------------------------------------------------- 1-D costs (pure)


def all_gather_time(total_bytes: float, link: AxisLink) -> float:
    """Ring all-gather time, seconds: ``(n-1) * alpha + (n-1)/n * T / beta``.

    ``T`` = bytes of the gathered tensor on the group; alpha (s per step) and
    beta (bus bytes/s) = the link's measured all-gather fit when its profile
    has one (``autopar calibrate``), else the link's latency and bandwidth.
    Source: Thakur, Rabenseifner, Gropp 2005; nccl-tests doc/PERFORMANCE.md
    (all-gather bus bytes = (n-1)/n * T).
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("all-gather")
    return (n - 1) * alpha + (n - 1) / n * total_bytes / beta


def reduce_scatter_time(total_bytes: float, link: AxisLink) -> float:
    """Ring reduce-scatter time, seconds: ``(n-1) * alpha + (n-1)/n * T / beta``.

    ``T`` = bytes of the full (unscattered) tensor; alpha (s per step) and
    beta (bus bytes/s) = the link's reduce-scatter fit, else its latency and
    bandwidth.  Source: Thakur et al. 2005; nccl-tests doc/PERFORMANCE.md.
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("reduce-scatter")
    return (n - 1) * alpha + (n - 1) / n * total_bytes / beta


def all_reduce_time(total_bytes: float, link: AxisLink) -> float:
    """Ring all-reduce time, seconds: ``2(n-1) * alpha + 2(n-1)/n * T / beta``.

    A reduce-scatter followed by an all-gather.  alpha (s per step) and beta
    (bus bytes/s) = the link's all-reduce fit, else its latency and
    bandwidth.  Source: Thakur et al. 2005; NCCL's "bus bandwidth" definition
    (nccl-tests doc/PERFORMANCE.md: all-reduce bus bytes = 2(n-1)/n * T).
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("all-reduce")
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * total_bytes / beta


def all_to_all_time(total_bytes: float, link: AxisLink) -> float:
    """Pairwise all-to-all time, seconds: ``(n-1) * alpha + (n-1)/n^2 * T / beta``.

    ``T`` = bytes of the tensor on the group; each device keeps 1/n of its
    ``T/n`` shard and sends the rest.  alpha (s per step) and beta (bus
    bytes/s) = the link's all-to-all fit, else its latency and bandwidth
    (nccl-tests alltoall_perf: bus bytes = (n-1)/n * the T/n bytes per
    device).  Source: Thakur et al. 2005.
    """
    n = link.size
    if n == 1:
        return 0.0
    alpha, beta = link.alpha_beta("all-to-all")
    return (n - 1) * alpha + (n - 1) / (n * n) * total_bytes / beta


def send_recv_time(total_bytes: float, link: AxisLink) -> float:
    """Point-to-point time, seconds: ``alpha + S / beta``.

    ``S`` = bytes one device sends to one peer of the axis (and receives from
    another, concurrently, as nccl-tests sendrecv_perf measures); alpha (s)
    and beta (bytes/s) = the link's send/recv fit, else its latency and
    bandwidth.  0 on a one-device axis (no peer).  Source: the alpha-beta
    (Hockney) model; nccl-tests doc/PERFORMANCE.md (send/recv bus bandwidth =
    algorithm bandwidth = S / t).
    """
    if link.size == 1:
        return 0.0
    alpha, beta = link.alpha_beta("send-recv")
    return alpha + total_bytes / beta


def collective_bytes(kind: Collective, total_bytes: float, n: int) -> float:
    """Bytes each device sends for ``kind`` on a group of ``n`` (ring algorithms)."""
    if n == 1 or kind is Collective.LOCAL:
        return 0.0
    if kind is Collective.ALL_REDUCE:
        return 2 * (n - 1) / n * total_bytes
    if kind is Collective.ALL_TO_ALL:
        return (n - 1) / (n * n) * total_bytes
    return (n - 1) / n * total_bytes


_TIME = {
    Collective.ALL_GATHER: all_gather_time,
    Collective.ALL_REDUCE: all_reduce_time,
    Collective.REDUCE_SCATTER: reduce_scatter_time,
    Collective.ALL_TO_ALL: all_to_all_time,
}
