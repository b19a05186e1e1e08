"""A profile's network cards (:class:`~autopar.hardware.network.NodeNetwork`) fitted from
nccl-tests runs over whole nodes: ``RESULTS/nodes<N>/<binary>.txt``, each the stdout of one
nccl-tests binary on every device of ``N`` nodes (one communicator, ``N x g`` ranks).

* ``all_reduce_perf``, ``reduce_scatter_perf``, ``all_gather_perf`` (rings): each node count's
  fitted bus bandwidth becomes that collective's ``bus_bandwidth_by_nodes[N]``, which prices
  rings over ``N`` nodes (:func:`~autopar.hardware.network.axis_bus_bandwidth`);
* ``sendrecv_perf`` (on the same ``N x g`` ranks, or one rank per node): the ring of sends
  crosses each node boundary from one device through one card, and that pair paces every
  rank, so its bus bandwidth is one card's: ``card_efficiency`` = the least over the node
  counts of bus bandwidth / the card's line rate.

The cards per node and their line rate are hardware facts, not measurements: the base
profile's, or ``--cards-per-node`` / ``--card-gbps``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autopar.errors import ConfigError
from autopar.hardware.nccl_tests import GB, CollectiveCalibration, NcclRun, calibrate_collective
from autopar.hardware.network import RING_COLLECTIVES, NodeNetwork, measured_table

__all__ = ["NODE_COLLECTIVES", "NodeCalibration", "calibrate_network"]

NODE_COLLECTIVES = (*RING_COLLECTIVES, "send-recv")
"""What a ``nodes<N>/`` folder may hold (nccl-tests binaries of these collectives)."""


@dataclass(frozen=True)
class NodeCalibration:
    """One collective fitted on a flat group over ``nodes`` whole nodes."""

    nodes: int
    calibration: CollectiveCalibration


@dataclass(frozen=True)
class NetworkCalibration:
    network: NodeNetwork | None
    runs: tuple[NodeCalibration, ...]


def calibrate_network(
    base: NodeNetwork | None,
    devices_per_node: int,
    node_runs: Mapping[int, Mapping[str, NcclRun]],
    cards_per_node: int | None,
    card_bandwidth: float | None,
    sources: dict[str, str],
) -> NetworkCalibration:
    """``base`` with the cards given and the figures measured on whole nodes replaced (module
    docstring); the replaced fields' descriptions are written to ``sources``.  Nothing given:
    ``base`` unchanged."""
    if not (node_runs or cards_per_node is not None or card_bandwidth is not None):
        return NetworkCalibration(base, ())
    cards = _cards(base, devices_per_node, cards_per_node)
    if card_bandwidth is not None:
        line_rate = card_bandwidth
    elif base is not None:
        line_rate = base.card_bandwidth
    else:
        raise ConfigError(
            "missing_argument",
            "the base profile states no network cards: give --cards-per-node and --card-gbps "
            "(the line rate of one card of the compute fabric, e.g. 200 for HDR InfiniBand)",
        )
    fitted = tuple(
        _fit(nodes, collective, run, devices_per_node)
        for nodes, runs in sorted(node_runs.items())
        for collective, run in sorted(runs.items())
    )
    rings = [f for f in fitted if f.calibration.collective in RING_COLLECTIVES]
    sends = [f for f in fitted if f.calibration.collective == "send-recv"]
    if sends:
        efficiency = _card_efficiency(sends, line_rate)
    elif base is not None:
        efficiency = base.card_efficiency
    else:
        raise ConfigError(
            "missing_argument",
            "no base profile states the cards' efficiency: add nodes<N>/sendrecv_perf.txt "
            "(docs/calibration.md) or start from a profile with links.network",
        )
    table = measured_table(
        {
            c: {f.nodes: f.calibration.fit.bus_bandwidth for f in rings if f.calibration.collective == c}
            for c in RING_COLLECTIVES
        }
    )
    if not rings and base is not None and base.devices_per_node == devices_per_node:
        table = base.bus_bandwidth_by_nodes  # measured on nodes like these: still true
    network = NodeNetwork(cards, devices_per_node, line_rate, efficiency, table)
    _describe(network, base, cards_per_node, card_bandwidth, rings, sends, sources)
    return NetworkCalibration(network, fitted)


def _cards(base: NodeNetwork | None, devices_per_node: int, cards_per_node: int | None) -> int:
    """The cards of a node of ``devices_per_node`` devices: as given, else the base's cards per
    device times the devices, when that is a whole number of cards."""
    if cards_per_node is not None:
        if cards_per_node < 1:
            raise ConfigError("bad_argument", f"--cards-per-node must be >= 1, got {cards_per_node}")
        return cards_per_node
    if base is None:
        raise ConfigError(
            "missing_argument",
            "the base profile states no network cards: give --cards-per-node and --card-gbps",
        )
    cards = base.cards_per_device * devices_per_node
    if not float(cards).is_integer() or cards < 1:
        raise ConfigError(
            "missing_argument",
            f"the base profile has {base.cards_per_node} cards per {base.devices_per_node} devices, "
            f"no whole number of cards for {devices_per_node} devices per node: give --cards-per-node",
        )
    return int(cards)


def _fit(nodes: int, collective: str, run: NcclRun, devices_per_node: int) -> NodeCalibration:
    """``run`` (``nodes<N>/<binary>``) checked to span ``nodes`` hosts, fitted."""
    if collective not in NODE_COLLECTIVES:
        raise ConfigError(
            "unsupported_node_measurement",
            f"{run.source}: a nodes<N>/ folder holds {', '.join(NODE_COLLECTIVES)} runs over whole "
            f"nodes, not {collective}; put per-axis runs under axis<i>/ (docs/calibration.md)",
            path=run.source,
        )
    if nodes < 2:
        raise ConfigError(
            "bad_node_count", f"{run.source}: nodes{nodes}/ is not across nodes; use nodes2/ or more"
        )
    if run.hosts is not None and run.hosts != nodes:
        raise ConfigError(
            "node_count_mismatch",
            f"{run.source}: its ranks run on {run.hosts} hosts but the folder says {nodes} nodes; "
            f"file it under nodes{run.hosts}/",
            path=run.source,
        )
    ranks = nodes * devices_per_node
    if collective == "send-recv" and run.ranks == nodes:
        ranks = nodes  # one rank per node: the same one card per crossing
    return NodeCalibration(nodes, calibrate_collective(run, collective, ranks))


def _card_efficiency(sends: list[NodeCalibration], line_rate: float) -> float:
    """The least send/recv bus bandwidth over the node counts / the card's line rate."""
    least = min(sends, key=lambda f: f.calibration.fit.bus_bandwidth)
    efficiency = least.calibration.fit.bus_bandwidth / line_rate
    if efficiency > 1:
        raise ConfigError(
            "card_above_line_rate",
            f"{least.calibration.source}: send/recv across nodes moved "
            f"{least.calibration.fit.bus_bandwidth / GB:.2f} GB/s, more than a card's line rate of "
            f"{line_rate / GB:.2f} GB/s; give the cards' rate with --card-gbps",
            path=least.calibration.source,
        )
    return efficiency


def _describe(
    network: NodeNetwork,
    base: NodeNetwork | None,
    cards_per_node: int | None,
    card_bandwidth: float | None,
    rings: list[NodeCalibration],
    sends: list[NodeCalibration],
    sources: dict[str, str],
) -> None:
    key = "links.network."
    if cards_per_node is not None:
        sources[key + "cards_per_node"] = f"--cards-per-node {cards_per_node} (as given to autopar calibrate)"
    elif base is not None and base.devices_per_node != network.devices_per_node:
        sources[key + "cards_per_node"] = (
            f"the base profile's {base.cards_per_node} cards per {base.devices_per_node} devices, "
            f"for {network.devices_per_node} devices"
        )
    sources[key + "devices_per_node"] = "the devices per node of the calibrated cluster (--cluster)"
    if card_bandwidth is not None:
        sources[key + "card_bandwidth_bytes_per_s"] = (
            f"--card-gbps {card_bandwidth * 8 / 1e9:g} (as given to autopar calibrate): line rate"
        )
    if sends:
        sources[key + "card_efficiency"] = (
            "send/recv across nodes (one card per crossing): "
            + "; ".join(f"{f.calibration.describe()}" for f in sends)
            + f" -> the least / the line rate {network.card_bandwidth / GB:g} GB/s"
        )
    if rings:
        sources[key + "bus_bandwidth_by_nodes"] = "; ".join(
            f"{f.nodes} nodes: {f.calibration.describe()}" for f in rings
        )
