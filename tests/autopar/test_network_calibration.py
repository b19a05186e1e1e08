"""``autopar calibrate`` on runs over whole nodes (``RESULTS/nodes<N>/``): the bus bandwidth per
node count and the cards' efficiency of a profile's ``links.network``.

The outputs are synthetic (``tests/autopar/nccl_output.py``): a RoCE fabric of 8-GPU nodes with
eight 100 Gb/s cards that slows as nodes are added (100, 58, 40 GB/s on 2, 4, 6 nodes, the
figures of NVIDIA/nccl-tests#169), and a send/recv across 2 nodes at 12 GB/s.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autopar.cli.main import main
from autopar.errors import ConfigError
from autopar.hardware.calibrate import calibrate_profile, read_results
from autopar.hardware.cluster import PROFILES, load_cluster_profile
from autopar.hardware.mesh import Mesh
from autopar.hardware.nccl_tests import parse_nccl_tests
from autopar.hardware.network import bandwidth_at_nodes
from tests.autopar.nccl_output import (
    FIXTURES,
    NODE_CARD_GBPS,
    NODE_DEVICES,
    NODE_FIXTURE,
    NODE_LINKS,
    Link,
    render,
)

NODES = FIXTURES / NODE_FIXTURE
A100 = PROFILES["a100-80g"]


def calibrate_cli(tmp_path: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "roce.json"
    argv = ["calibrate", str(NODES), "--cluster", f"6x{NODE_DEVICES}", "--preset", "a100-80g"]
    return main([*argv, *extra, "--out", str(out)]), out


def test_runs_over_whole_nodes_give_the_table_and_the_cards_efficiency(tmp_path, capsys):
    rc, out = calibrate_cli(tmp_path, "--cards-per-node", "8", "--card-gbps", str(NODE_CARD_GBPS))
    assert rc == 0
    printed = capsys.readouterr().out
    assert "2 nodes (16 ranks)" in printed and "6 nodes (48 ranks)" in printed
    assert "network: 8 cards per 8 devices at 100 Gb/s, card efficiency 0.96" in printed
    profile = load_cluster_profile(out)
    network = profile.links.network
    assert network is not None
    table = network.measured("all-reduce")
    assert sorted(table) == [2, 4, 6]
    for nodes, links in NODE_LINKS.items():
        assert table[nodes] == pytest.approx(links["all-reduce"].bus_bandwidth, rel=0.02)
    assert network.card_efficiency == pytest.approx(12e9 / 12.5e9, rel=0.02)
    assert network.card_bandwidth == 12.5e9 and network.cards_per_node == 8
    for key in ("bus_bandwidth_by_nodes", "card_efficiency", "cards_per_node", "card_bandwidth_bytes_per_s"):
        assert profile.sources[f"links.network.{key}"]
    assert "nodes6/all_reduce_perf.txt" in profile.sources["links.network.bus_bandwidth_by_nodes"]
    assert "nodes2/sendrecv_perf.txt" in profile.sources["links.network.card_efficiency"]
    # priced: a flat group over 5 nodes reads the table between 4 and 6; one device per node
    # gets 1/8 of it; send/recv the measured card
    flat = Mesh(profile.cluster(5, 8), (40,))
    assert flat.axes[0].alpha_beta("all-reduce")[1] == pytest.approx(bandwidth_at_nodes(table, 5))
    layered = Mesh(profile.cluster(6, 8), (6, 8))
    assert layered.axes[0].alpha_beta("all-reduce")[1] == pytest.approx(table[6] / 8)
    assert layered.axes[0].alpha_beta("send-recv")[1] == pytest.approx(12e9, rel=0.02)


def test_a_calibrated_fabric_prices_a_baseline_slower_than_the_preset(tmp_path, capsys):
    rc, out = calibrate_cli(tmp_path, "--cards-per-node", "8", "--card-gbps", str(NODE_CARD_GBPS))
    assert rc == 0
    times = {}
    for name, extra in (("preset", ["--preset", "a100-80g"]), ("roce", ["--cluster-profile", str(out)])):
        plan = tmp_path / f"{name}.json"
        argv = ["baseline", "data-parallel", "mt5-base", "--cluster", "6x8", "--mesh-shape", "48"]
        assert main([*argv, *extra, "--out", str(plan)]) == 0
        times[name] = json.loads(plan.read_text())["predicted"]["iteration_time_s"]
    capsys.readouterr()
    assert times["roce"] > times["preset"]


def test_the_cards_come_from_the_base_profile_when_not_given(tmp_path, capsys):
    rc, out = calibrate_cli(tmp_path)
    assert rc == 0
    network = load_cluster_profile(out).links.network
    assert network is not None and network.cards_per_node == 8
    assert network.card_bandwidth == A100.links.network.card_bandwidth  # type: ignore[union-attr]
    # 100 Gb/s measured as send/recv against a 200 Gb/s card: half of its line rate
    assert network.card_efficiency == pytest.approx(12e9 / 25e9, rel=0.02)
    capsys.readouterr()


def test_runs_over_nodes_and_mesh_axes_in_one_folder(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(FIXTURES / "2x4-mesh4x2", results)
    (results / "nodes2").mkdir()
    text = render("all-reduce", Link(8e-6, 90e9), world=8, devices_per_node=4, seed=7)
    (results / "nodes2" / "all_reduce_perf.txt").write_text(text)
    found = read_results(results)
    assert sorted(found.axes) == [0, 1] and sorted(found.nodes) == [2]
    cal = calibrate_profile(A100, 2, 4, (4, 2), found.axes, node_runs=found.nodes)
    assert len(cal.profile.links.mesh_axes) == 2 and len(cal.nodes) == 1
    network = cal.profile.links.network
    assert network is not None and network.devices_per_node == 4 and network.cards_per_node == 4
    assert network.measured("all-reduce")[2] == pytest.approx(90e9, rel=0.02)
    assert network.card_efficiency == A100.links.network.card_efficiency  # type: ignore[union-attr]


def test_send_recv_may_run_one_rank_per_node():
    text = render("send-recv", Link(10e-6, 23e9), world=2, devices_per_node=1, seed=3)
    run = parse_nccl_tests(text)
    assert run.ranks == 2 and run.hosts == 2
    cal = calibrate_profile(A100, 2, 8, (16,), {}, node_runs={2: {"send-recv": run}})
    assert cal.profile.links.network.card_efficiency == pytest.approx(23 / 25, rel=0.02)  # type: ignore[union-attr]


def test_node_runs_that_do_not_match_their_folder_are_refused(tmp_path):
    two_nodes = parse_nccl_tests(
        render("all-reduce", Link(6e-6, 1e11), world=16, devices_per_node=8), "n.txt"
    )
    with pytest.raises(ConfigError, match="run on 2 hosts but the folder says 4 nodes") as e:
        calibrate_profile(A100, 4, 8, (32,), {}, node_runs={4: {"all-reduce": two_nodes}})
    assert e.value.code == "node_count_mismatch"
    six_per_node = parse_nccl_tests(render("all-reduce", Link(6e-6, 1e11), world=12, devices_per_node=6))
    with pytest.raises(ConfigError) as e:
        calibrate_profile(A100, 2, 8, (16,), {}, node_runs={2: {"all-reduce": six_per_node}})
    assert e.value.code == "rank_mismatch"
    alltoall = parse_nccl_tests(render("all-to-all", Link(6e-6, 1e10), world=16, devices_per_node=8), "a.txt")
    with pytest.raises(ConfigError, match="not all-to-all") as e:
        calibrate_profile(A100, 2, 8, (16,), {}, node_runs={2: {"all-to-all": alltoall}})
    assert e.value.code == "unsupported_node_measurement"
    fast = parse_nccl_tests(render("send-recv", Link(10e-6, 12e9), world=16, devices_per_node=8), "s.txt")
    with pytest.raises(ConfigError, match="more than a card's line rate") as e:
        calibrate_profile(A100, 2, 8, (16,), {}, node_runs={2: {"send-recv": fast}}, card_bandwidth=50e9 / 8)
    assert e.value.code == "card_above_line_rate"


def test_a_base_without_cards_needs_them_given(tmp_path, capsys):
    data = A100.to_dict()
    del data["links"]["network"]
    base = tmp_path / "old.json"
    base.write_text(json.dumps(data))
    out = tmp_path / "p.json"
    argv = ["calibrate", str(NODES), "--cluster", "6x8", "--base-profile", str(base), "--out", str(out)]
    assert main(argv) != 0
    assert "missing_argument" in capsys.readouterr().err
    assert main([*argv, "--cards-per-node", "8", "--card-gbps", "100"]) == 0
    assert load_cluster_profile(out).links.network is not None
    capsys.readouterr()


def test_a_results_folder_needs_the_cluster_and_axes_need_the_mesh(tmp_path, capsys):
    out = str(tmp_path / "p.json")
    assert main(["calibrate", str(NODES), "--out", out]) != 0
    assert "--cluster" in capsys.readouterr().err
    both = tmp_path / "both"
    shutil.copytree(FIXTURES / "2x4-mesh4x2", both)
    assert main(["calibrate", str(both), "--cluster", "2x4", "--out", out]) != 0
    assert "--mesh-shape" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as e:
        read_results(tmp_path / "empty")
    assert e.value.code == "no_measurements"


def test_the_cards_alone_can_be_restated(tmp_path, capsys):
    """A lab with four HDR cards per 8-GPU node, nothing measured: the rest stays the preset's."""
    out = tmp_path / "p.json"
    argv = ["calibrate", "--cards-per-node", "4", "--cluster", "2x8", "--preset", "a100-40g"]
    assert main([*argv, "--out", str(out)]) == 0
    profile = load_cluster_profile(out)
    network = profile.links.network
    base = PROFILES["a100-40g"].links.network
    assert network is not None and base is not None
    assert (network.cards_per_node, network.devices_per_node) == (4, 8)
    assert (network.card_bandwidth, network.card_efficiency) == (base.card_bandwidth, base.card_efficiency)
    assert "network cards given" in profile.description
    flat = Mesh(profile.cluster(3, 8), (24,))
    assert flat.axes[0].alpha_beta("all-reduce")[1] == pytest.approx(4 * 24e9)  # NVIDIA/nccl-tests#119: 96
    capsys.readouterr()
