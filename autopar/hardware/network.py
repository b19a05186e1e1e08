"""Collectives as NCCL runs them across nodes: a node's network cards (:class:`NodeNetwork`,
a profile's ``links.network``) and the bus bandwidth the groups of a mesh axis that span
nodes get from them (pure functions; :func:`axis_bus_bandwidth` is the one a mesh calls).

Vocabulary, per mesh axis: ``n`` devices per group, ``k`` of them on each node the group
touches, ``N = n / k`` nodes; a node holds ``g`` devices and ``C`` network cards of line
rate ``B_card`` (bytes/s) of which NCCL reaches the fraction ``eff``; ``c = C / g`` cards per
device; ``B_nvl`` the intra-node (NVLink) link's bus bandwidth for the same collective.
Every group of an axis runs at once (training runs them together), so ``g / k`` groups
share a node's cards.

**Rings (all-reduce, reduce-scatter, all-gather).**  NCCL lays a ring node by node: inside
a node it passes the group's ``k`` members over NVLink, then leaves the node by a card to
the next node, and it opens one channel (one ring) per card, each carrying its share of
the data.  A rank of a ring all-reduce sends ``2(n-1)/n T`` bytes (reduce-scatter or
all-gather ``(n-1)/n T``), split over the channels; on each channel the bytes that leave a
node through its card are exactly what the node's last member sends on that channel, so
over all channels a group sends out of each node what one rank sends: ``2(n-1)/n T``.  The
time is that over the card bandwidth the group has on the node, ``k C B_card eff / g`` (the
node's cards shared by its ``g / k`` groups), and nccl-tests' bus bandwidth
(``busbw = 2(n-1)/n T / t``, doc/PERFORMANCE.md) is that card bandwidth.  Each rank also
sends its ``2(n-1)/n T`` over NVLink on the intra-node hops, so the ring is no faster than
the intra-node link::

    busbw = min(k * c * B_card * eff, B_nvl)                  (bytes/s)

A flat group (``k = g``) gets the node's whole card bandwidth ``C B_card eff``; one device
per node (``k = 1``) one card's share ``c B_card eff``.  Sources: NCCL's maintainers --
"Ring Allreduce requires data to go through each GPU and enter/exit the node once"
(NVIDIA/nccl#687), more NICs on a node give "more bandwidth, up to 160GB/s which is the
NVLink intra-node bandwidth of your system" (NVIDIA/nccl#412), "On an Nvidia DGX-A100
system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW" (= 8 x 24,
NVIDIA/nccl#812).

**Point to point (send/recv).**  One peer's stream leaves by the card nearest the device and
is not split over cards, and every device of a node sends at once, so a device gets
``min(c, 1) * B_card * eff`` (bounded by ``B_nvl``).

**All-to-all.**  A rank sends ``T / n^2`` to each of its ``n - 1`` peers; ``n - k`` of them
are on other nodes, so ``(n - k) T / n^2`` crosses a card at the point-to-point share (NCCL
"cannot aggregate the bandwidth of multiple NICs" for all-to-all, NVIDIA/nccl-tests#267).
nccl-tests counts ``(n-1)/n * T/n`` bus bytes per rank, so::

    busbw = min((n - 1) / (n - k) * min(c, 1) * B_card * eff, B_nvl)

(for a flat group ``N / (N - 1)`` times the per-device card bandwidth, as NCCL's
maintainers state it, NVIDIA/nccl-tests#130).

**Fabrics that slow down with more nodes.**  A profile may give the bus bandwidth measured
on ``N`` whole nodes per collective (``bus_bandwidth_by_nodes``, e.g. a RoCE fabric:
about 100 GB/s on 2 nodes, 58 on 4, 40 on 6, NVIDIA/nccl-tests#169).  It then replaces
``C B_card eff`` for rings: ``busbw = min(k * table(N) / g, B_nvl)``, ``table(N)`` read by
:func:`bandwidth_at_nodes`.  A reduce-scatter or all-gather without its own table uses the
all-reduce one, no faster than the cards (``min(table(N), C B_card eff)``): only an
all-reduce's tree may beat the cards on 2 nodes ("two nodes Tree BusBW figures that exceed
the theoretical limit of the network cards", NVIDIA/nccl#812).  Point-to-point and
all-to-all keep the card figures: the tables time rings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autopar.errors import ConfigError
from autopar.hardware.json_fields import check_keys, number

__all__ = [
    "RING_COLLECTIVES",
    "NodeNetwork",
    "all_to_all_bus_bandwidth",
    "axis_bus_bandwidth",
    "bandwidth_at_nodes",
    "measured_table",
    "point_to_point_bandwidth",
    "ring_bus_bandwidth",
]

RING_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter")
"""The collectives NCCL runs as rings over every card of a node."""
POINT_TO_POINT = ("send-recv", "all-to-all")
"""The collectives whose streams each take one card."""

_FIELDS = {
    "cards_per_node",
    "devices_per_node",
    "card_bandwidth_bytes_per_s",
    "card_efficiency",
    "bus_bandwidth_by_nodes",
}


@dataclass(frozen=True)
class NodeNetwork:
    """A node's network cards as NCCL uses them (formulas in the module docstring).

    JSON form (a profile's ``links.network``)::

        {"cards_per_node": 8, "devices_per_node": 8, "card_bandwidth_bytes_per_s": 2.5e10,
         "card_efficiency": 0.96,
         "bus_bandwidth_by_nodes": {"all-reduce": {"2": 1.0e11, "4": 5.8e10}}}   # optional

    A cluster whose nodes hold another number of devices than ``devices_per_node`` keeps
    the cards per device, ``c = cards_per_node / devices_per_node``.
    """

    cards_per_node: int
    """network cards of the compute fabric in one node"""
    devices_per_node: int
    """devices of the node these cards serve"""
    card_bandwidth: float
    """line rate of one card, bytes/s (200 Gb/s HDR = 25e9)"""
    card_efficiency: float
    """fraction of the line rate NCCL reaches on a card, in (0, 1]"""
    bus_bandwidth_by_nodes: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    """per ring collective, (nodes, bus bandwidth in bytes/s) of a flat group over that many
    whole nodes, measured; sorted by collective then nodes"""

    def __post_init__(self) -> None:
        for name in ("cards_per_node", "devices_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("bad_profile", f"network: {name} must be an integer >= 1, got {value!r}")
        if not (math.isfinite(self.card_bandwidth) and self.card_bandwidth > 0):
            raise ConfigError(
                "bad_profile", f"network: card bandwidth must be > 0 bytes/s, got {self.card_bandwidth}"
            )
        if not 0 < self.card_efficiency <= 1:
            raise ConfigError(
                "bad_profile",
                f"network: card_efficiency must be in (0, 1], got {self.card_efficiency}; it is the "
                "fraction of the card's line rate NCCL reaches",
            )
        for collective, points in self.bus_bandwidth_by_nodes:
            if collective not in RING_COLLECTIVES:
                raise ConfigError(
                    "bad_profile",
                    f"network.bus_bandwidth_by_nodes: {collective!r} is not a ring collective; "
                    f"use {RING_COLLECTIVES}",
                )
            for nodes, bandwidth in points:
                if nodes < 2 or not (math.isfinite(bandwidth) and bandwidth > 0):
                    raise ConfigError(
                        "bad_profile",
                        f"network.bus_bandwidth_by_nodes.{collective}: need nodes >= 2 and a bus "
                        f"bandwidth > 0 bytes/s, got {nodes}: {bandwidth}",
                    )

    @property
    def cards_per_device(self) -> float:
        """``c = C / g``."""
        return self.cards_per_node / self.devices_per_node

    @property
    def ring_bandwidth_per_device(self) -> float:
        """``c * B_card * eff``, bytes/s: a device's share of its node's cards in a ring."""
        return self.cards_per_device * self.card_bandwidth * self.card_efficiency

    @property
    def point_to_point_per_device(self) -> float:
        """``min(c, 1) * B_card * eff``, bytes/s: what one device's stream gets from a card."""
        return min(self.cards_per_device, 1.0) * self.card_bandwidth * self.card_efficiency

    def measured(self, collective: str) -> dict[int, float]:
        """``{nodes: bus bandwidth}`` measured for ``collective`` (empty when not measured)."""
        return dict(next((points for c, points in self.bus_bandwidth_by_nodes if c == collective), ()))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cards_per_node": self.cards_per_node,
            "devices_per_node": self.devices_per_node,
            "card_bandwidth_bytes_per_s": self.card_bandwidth,
            "card_efficiency": self.card_efficiency,
        }
        if self.bus_bandwidth_by_nodes:
            out["bus_bandwidth_by_nodes"] = {
                c: {str(nodes): bw for nodes, bw in points} for c, points in self.bus_bandwidth_by_nodes
            }
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "network") -> NodeNetwork:
        """Parse the JSON form; a ConfigError (``bad_profile``) names the field that is wrong."""
        check_keys(data, _FIELDS, where)
        counts = {}
        for key in ("cards_per_node", "devices_per_node"):
            value = number(data, key, where)
            if not value.is_integer():
                raise ConfigError("bad_profile", f"{where}.{key} must be a whole number, got {value}")
            counts[key] = int(value)
        table = data.get("bus_bandwidth_by_nodes", {})
        check_keys(table, set(RING_COLLECTIVES), f"{where}.bus_bandwidth_by_nodes")
        return cls(
            counts["cards_per_node"],
            counts["devices_per_node"],
            number(data, "card_bandwidth_bytes_per_s", where),
            number(data, "card_efficiency", where),
            measured_table(
                {c: _node_points(p, f"{where}.bus_bandwidth_by_nodes.{c}") for c, p in table.items()}
            ),
        )


def measured_table(
    table: Mapping[str, Mapping[int, float]],
) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    """``{collective: {nodes: bus bandwidth}}`` in :attr:`NodeNetwork.bus_bandwidth_by_nodes` form."""
    return tuple(
        (c, tuple(sorted((int(n), float(bw)) for n, bw in points.items())))
        for c, points in sorted(table.items())
        if points
    )


def _node_points(data: Any, where: str) -> dict[int, float]:
    if not isinstance(data, Mapping):
        raise ConfigError("bad_profile", f"{where} must map node counts to bytes/s, got {data!r}")
    points: dict[int, float] = {}
    for key in data:
        if not str(key).isdigit():
            raise ConfigError("bad_profile", f"{where}: {key!r} is not a node count")
        points[int(key)] = number(data, key, where)
    return points


# ------------------------------------------------------------- pure functions


def ring_bus_bandwidth(
    members_per_node: int, bandwidth_per_device: float, nvlink_bus_bandwidth: float
) -> float:
    """Bus bandwidth of a ring collective over a group spanning nodes, bytes/s:
    ``min(k * b, B_nvl)``.

    ``k`` = members of the group on each node, ``b`` = a device's share of its node's card
    bandwidth (``c * B_card * eff``, or a measured ``table(N) / g``), ``B_nvl`` = the
    intra-node link's bus bandwidth.  Derivation: module docstring (the group sends out of
    each node what one rank sends, over the ``k`` devices' share of the cards).
    """
    return min(members_per_node * bandwidth_per_device, nvlink_bus_bandwidth)


def point_to_point_bandwidth(per_device: float, nvlink_bus_bandwidth: float) -> float:
    """Bandwidth of one device's send/recv to a peer on another node, bytes/s:
    ``min(min(c, 1) * B_card * eff, B_nvl)`` (``per_device`` = the first term,
    :attr:`NodeNetwork.point_to_point_per_device`): one card's share, never several cards."""
    return min(per_device, nvlink_bus_bandwidth)


def all_to_all_bus_bandwidth(
    group_size: int, members_per_node: int, per_device: float, nvlink_bus_bandwidth: float
) -> float:
    """nccl-tests bus bandwidth of an all-to-all over a group spanning nodes, bytes/s:
    ``min((n - 1) / (n - k) * min(c, 1) * B_card * eff, B_nvl)``.

    ``(n - k) / n`` of a rank's bytes cross a card at the point-to-point share
    ``per_device``; the bus bytes nccl-tests counts are ``(n - 1) / n`` of them (module
    docstring; NVIDIA/nccl-tests#130).  ``k >= n`` (one node) is not a crossing group:
    ``B_nvl``.
    """
    n, k = group_size, members_per_node
    if k >= n:
        return nvlink_bus_bandwidth
    return min((n - 1) / (n - k) * per_device, nvlink_bus_bandwidth)


def bandwidth_at_nodes(points: Mapping[int, float], nodes: int) -> float:
    """A measured bus bandwidth at ``nodes`` nodes from ``{nodes: bytes/s}``, conservatively.

    * at a measured count: the measurement;
    * between two measured counts: the power law through them, ``b1 (N / N1)^p``,
      ``p = ln(b2 / b1) / ln(N2 / N1)`` (a straight line on log-log axes, where a falling
      fabric's curve is close to straight: 100, 58, 40 GB/s on 2, 4, 6 nodes);
    * below the smallest count: the smallest count's measurement (fewer nodes are no
      slower, so this never promises more than was measured);
    * above the largest: the last two points' power law carried on while it falls, never
      above the last measurement (a fabric that slowed from ``N1`` to ``N2`` is assumed to
      keep slowing at that rate; one point, or a rise, holds the last value).
    """
    if not points:
        raise ConfigError("bad_profile", "no measured bus bandwidth to read")
    xs = sorted(points)
    if nodes in points:
        return points[nodes]
    if nodes < xs[0]:
        return points[xs[0]]
    if nodes > xs[-1]:
        if len(xs) == 1:
            return points[xs[-1]]
        lo, hi = xs[-2], xs[-1]
        return min(points[hi], _power_law(lo, points[lo], hi, points[hi], nodes))
    hi = next(x for x in xs if x > nodes)
    lo = max(x for x in xs if x < nodes)
    return _power_law(lo, points[lo], hi, points[hi], nodes)


def _power_law(x1: int, y1: float, x2: int, y2: float, x: int) -> float:
    p = math.log(y2 / y1) / math.log(x2 / x1)
    return y1 * (x / x1) ** p


def axis_bus_bandwidth(
    network: NodeNetwork,
    collective: str,
    group_size: int,
    members_per_node: int,
    nodes: int,
    nvlink_bus_bandwidth: float,
) -> float:
    """The bus bandwidth (bytes/s) of ``collective`` on a mesh axis whose groups of
    ``group_size`` span ``nodes`` nodes with ``members_per_node`` on each: the module
    docstring's formulas, a measured ``bus_bandwidth_by_nodes`` table first for rings."""
    if collective == "send-recv":
        return point_to_point_bandwidth(network.point_to_point_per_device, nvlink_bus_bandwidth)
    if collective == "all-to-all":
        return all_to_all_bus_bandwidth(
            group_size, members_per_node, network.point_to_point_per_device, nvlink_bus_bandwidth
        )
    if collective not in RING_COLLECTIVES:
        raise ConfigError("unknown_collective", f"unknown collective {collective!r}")
    per_device = network.ring_bandwidth_per_device
    own, all_reduce = network.measured(collective), network.measured("all-reduce")
    if own:
        per_device = bandwidth_at_nodes(own, nodes) / network.devices_per_node
    elif all_reduce:
        per_device = min(per_device, bandwidth_at_nodes(all_reduce, nodes) / network.devices_per_node)
    return ring_bus_bandwidth(members_per_node, per_device, nvlink_bus_bandwidth)
