"""Calibration from nccl-tests output: parsing, the alpha-beta fit, profiles, the CLI.

No GPU here: the nccl-tests outputs are synthetic, rendered in nccl-tests' own format by
``tests/autopar/nccl_output.py`` from known (alpha, bus bandwidth) with noise.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autopar.cli.main import main
from autopar.errors import ConfigError
from autopar.hardware.calibrate import calibrate_profile, read_results_dir
from autopar.hardware.cluster import PROFILES, Cluster, ClusterProfile, load_cluster_profile
from autopar.hardware.collectives import all_gather_time, all_reduce_time, reduce_scatter_time, send_recv_time
from autopar.hardware.kernel_timings import (
    fit_gemm_ceiling,
    memory_efficiency,
    parse_copy_table,
    parse_gemm_table,
)
from autopar.hardware.mesh import Mesh
from autopar.hardware.nccl_tests import algorithm_steps, bus_factor, calibrate_collective, parse_nccl_tests
from autopar.ir.sbp import B, P, S, nd
from autopar.runtimes.registry import boxing_time
from tests.autopar.nccl_output import (
    FIXTURE_LINKS,
    FIXTURES,
    GEMM_TFLOPS_CEILING,
    Link,
    fixture_files,
    render,
)
from tests.graphs import mlp_graph

RESULTS = FIXTURES / "2x4-mesh4x2"
A100 = PROFILES["a100-40g"]


def calibrated(links: dict[int, dict[str, Link]] | None = None, noise: float = 0.015) -> ClusterProfile:
    """A [4, 2] profile on 2x4 from rendered outputs (the fixture's links by default)."""
    masks = {0: 0x1, 1: 0x6}
    links = links or {axis: fits for axis, (_, fits) in FIXTURE_LINKS.items()}
    runs = {
        axis: {
            c: parse_nccl_tests(render(c, link, split_mask=masks[axis], noise=noise))
            for c, link in fits.items()
        }
        for axis, fits in links.items()
    }
    return calibrate_profile(A100, 2, 4, (4, 2), runs).profile


def test_committed_fixtures_match_their_generator():
    for rel, text in fixture_files().items():
        assert (FIXTURES / rel).read_text() == text, (
            f"regenerate with python -m tests.autopar.nccl_output: {rel}"
        )


def test_nccl_info_logs_between_rows_are_skipped():
    text = (RESULTS / "axis1" / "all_reduce_perf.txt").read_text()
    lines = text.splitlines()
    at = _row_line(text, 1024)
    logs = [
        "node-01:41200:41230 [0] NCCL INFO Channel 00/24 :    0   1",
        "10-gpu-a:41200:41230 [0] NCCL INFO Connected all rings",
        "NCCL version 2.18.3+cuda12.2",
    ]
    noisy = "\n".join([*lines[:at], *logs, *lines[at:]]) + "\n"
    clean, parsed = parse_nccl_tests(text), parse_nccl_tests(noisy)
    assert parsed.ranks == clean.ranks == 2
    assert [(r.size_bytes, r.time_s) for r in parsed.rows] == [(r.size_bytes, r.time_s) for r in clean.rows]


def test_parse_reads_rows_of_both_halves_and_the_group_size():
    run = parse_nccl_tests((RESULTS / "axis0" / "all_gather_perf.txt").read_text(), "ag")
    assert run.ranks == 4  # ranks 0, 2, 4, 6 share rank 0's group
    sizes = sorted({r.size_bytes for r in run.rows})
    assert sizes[0] == 16 and sizes[-1] == 1 << 30  # the size-0 row is skipped
    assert len(run.rows) == 2 * len(sizes)  # out-of-place and in-place
    assert parse_nccl_tests((RESULTS / "axis1" / "all_reduce_perf.txt").read_text()).ranks == 2


@pytest.mark.parametrize(
    "collective", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"]
)
@pytest.mark.parametrize("ranks,mask", [(2, 0x6), (4, 0x1), (8, 0x0)])
def test_fit_recovers_synthetic_alpha_and_bus_bandwidth(collective, ranks, mask):
    truth = Link(alpha=7e-6, bus_bandwidth=42e9)
    for seed in range(3):
        run = parse_nccl_tests(render(collective, truth, split_mask=mask, noise=0.02, seed=seed))
        assert run.ranks == ranks
        cal = calibrate_collective(run, collective, ranks)
        assert cal.fit.bus_bandwidth == pytest.approx(truth.bus_bandwidth, rel=0.02)
        assert cal.fit.alpha == pytest.approx(truth.alpha, rel=0.05)
        assert cal.line.max_relative_error < 0.03


def test_bus_factor_and_steps_follow_nccl_tests():
    assert bus_factor("all-reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all-gather", 8) == bus_factor("reduce-scatter", 8) == pytest.approx(7 / 8)
    assert bus_factor("send-recv", 8) == 1
    assert algorithm_steps("all-reduce", 4) == 2 * algorithm_steps("all-gather", 4) == 6
    with pytest.raises(ConfigError) as e:
        bus_factor("broadcast", 4)
    assert e.value.code == "unknown_collective"


def test_profile_reproduces_the_measured_times():
    """The boxing time functions, on the calibrated links, give back what nccl-tests timed."""
    profile = load_cluster_profile_from_cli_fixture()
    mesh = Mesh(profile.cluster(2, 4), (4, 2))
    functions = {
        "all_reduce_perf": all_reduce_time,
        "all_gather_perf": all_gather_time,
        "reduce_scatter_perf": reduce_scatter_time,
        "sendrecv_perf": send_recv_time,
    }
    for axis, link in enumerate(mesh.axes):
        for binary, time_fn in functions.items():
            run = parse_nccl_tests((RESULTS / f"axis{axis}" / f"{binary}.txt").read_text())
            for row in run.rows:
                assert time_fn(row.size_bytes, link) == pytest.approx(row.time_s, rel=0.03)


def load_cluster_profile_from_cli_fixture() -> ClusterProfile:
    return calibrate_profile(A100, 2, 4, (4, 2), read_results_dir(RESULTS)).profile


def test_faster_links_give_lower_boxing_times():
    slow = calibrated()
    fast = calibrated(
        {
            axis: {c: Link(link.alpha / 2, link.bus_bandwidth * 2) for c, link in fits.items()}
            for axis, (_, fits) in FIXTURE_LINKS.items()
        }
    )
    shape, item = (4096, 4096), 2
    moves_2d = [
        (nd(P, P), nd(B, B)),
        (nd(S(0), S(1)), nd(B, B)),
        (nd(P, B), nd(S(0), B)),
        (nd(B, S(0)), nd(B, B)),
    ]
    moves_1d = [(nd(P), nd(B)), (nd(S(0)), nd(B)), (nd(P), nd(S(0))), (nd(S(0)), nd(S(1)))]
    for mesh_shape in ((4, 2), (2, 4), (8,)):
        for src, dst in moves_1d if len(mesh_shape) == 1 else moves_2d:
            t_slow = boxing_time(shape, item, src, dst, Mesh(slow.cluster(2, 4), mesh_shape))
            t_fast = boxing_time(shape, item, src, dst, Mesh(fast.cluster(2, 4), mesh_shape))
            assert 0 < t_fast < t_slow, (mesh_shape, src, dst)


def test_calibrated_mesh_uses_the_measured_axis_then_the_link_kind():
    profile = calibrated()
    on_4x2 = Mesh(profile.cluster(2, 4), (4, 2))
    inter, intra = on_4x2.axes
    assert inter.crosses_nodes and not intra.crosses_nodes
    assert inter.alpha_beta("all-gather")[1] == pytest.approx(19.5e9, rel=0.02)
    assert intra.alpha_beta("all-reduce")[1] == pytest.approx(120e9, rel=0.02)
    # all-to-all was not measured: the link's default (its all-reduce fit) prices it
    assert intra.alpha_beta("all-to-all") == intra.alpha_beta("all-reduce")
    # another mesh shape: [2, 4] axis 1 stays in a node and takes the intra-node link; axis 0
    # spans nodes with one device on each, so the network cards (the base's links.network)
    # price its bandwidth, one card's share, and the measured inter-node fits its latency
    on_2x4 = Mesh(profile.cluster(2, 4), (2, 4))
    assert on_2x4.axes[1].collectives == intra.collectives
    network = profile.links.network
    assert network is not None and network == A100.links.network
    for collective in ("all-reduce", "all-gather", "reduce-scatter", "send-recv"):
        alpha, beta = on_2x4.axes[0].alpha_beta(collective)
        assert alpha == inter.alpha_beta(collective)[0]
        assert beta == pytest.approx(network.point_to_point_per_device)
    # a single node has no inter-node axis: every axis is priced with the intra-node link
    one_node = Mesh(profile.cluster(1, 8), (4, 2))
    assert all(a.collectives == intra.collectives for a in one_node.axes)


def test_profile_round_trips_through_json(tmp_path: Path):
    profile = calibrated()
    assert ClusterProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    profile.save(tmp_path / "p.json")
    assert load_cluster_profile(tmp_path / "p.json") == profile
    cluster = profile.cluster(2, 4)
    assert Cluster.from_dict(json.loads(json.dumps(cluster.to_dict()))) == cluster
    mesh = Mesh(cluster, (4, 2))
    assert Mesh.from_dict(mesh.to_dict()).axes == mesh.axes
    # the measured links are part of the cost key, so cached costs of the preset are not reused
    assert mesh.key() != Mesh(Cluster.parse("2x4", "a100-40g"), (4, 2)).key()


def test_unmeasured_numbers_and_their_sources_stay_the_base_profiles():
    profile = calibrated({1: {"all-reduce": Link(4e-6, 120e9)}})  # only the intra-node axis
    assert profile.device.inter_node_bandwidth == A100.device.inter_node_bandwidth
    assert profile.device.matmul_efficiency == A100.device.matmul_efficiency
    assert (
        profile.sources["links.inter_node.bandwidth_bytes_per_s"]
        == A100.sources["links.inter_node.bandwidth_bytes_per_s"]
    )
    assert "axis 1" in profile.sources["links.intra_node.bandwidth_bytes_per_s"]
    assert profile.device.intra_node_bandwidth == pytest.approx(120e9, rel=0.02)


def test_gemm_and_copy_tables_give_efficiencies():
    gemms = parse_gemm_table((FIXTURES / "gemm.csv").read_text())
    # large GEMMs (every one fills the 108 SMs): the ceiling is their FLOP-weighted fraction of peak
    fit = fit_gemm_ceiling(gemms, A100.device)
    assert fit.ceiling == pytest.approx(0.6, rel=1e-3) and fit.compute_bound == fit.points == len(gemms)
    copies = parse_copy_table((FIXTURES / "copy.csv").read_text())
    assert memory_efficiency(copies, 1.555e12) == pytest.approx(1.2e12 / 1.555e12, rel=1e-3)
    # the same table on a faster device is a smaller fraction of its peak
    assert fit_gemm_ceiling(gemms, PROFILES["h100-80g"].device).ceiling < fit.ceiling
    with pytest.raises(ConfigError) as e:
        fit_gemm_ceiling(gemms, replace(A100.device, peak_flops=100e12))
    assert e.value.code == "gemm_above_peak"


def test_gemm_ceiling_is_recovered_from_a_table_of_mixed_shapes():
    # rendered from the cost model with a known ceiling: thin and under-filled rows included
    gemms = parse_gemm_table((FIXTURES / "gemm-tflops.csv").read_text(), "gemm-tflops.csv")
    fit = fit_gemm_ceiling(gemms, A100.device)
    assert fit.ceiling == pytest.approx(GEMM_TFLOPS_CEILING, rel=1e-3)
    assert fit.max_relative_error < 1e-3
    assert 0 < fit.compute_bound < fit.points  # the thin (m = 16) rows are memory-bound: left out
    assert {g.batch for g in gemms} == {1, 96}


def test_gemm_table_in_seconds_or_tflops_is_the_same_measurement():
    tflops = parse_gemm_table("m,n,k,dtype,tflops\n4096,4096,4096,bf16,200\n")
    seconds = parse_gemm_table(f"m,n,k,dtype,seconds\n4096,4096,4096,bf16,{2 * 4096**3 / 200e12!r}\n")
    assert tflops[0].seconds == pytest.approx(seconds[0].seconds)
    assert fit_gemm_ceiling(tflops, A100.device).ceiling == pytest.approx(200 / 312)


def test_calibrated_profile_carries_the_gemm_ceiling_and_its_source():
    runs = read_results_dir(RESULTS)
    gemms = parse_gemm_table((FIXTURES / "gemm-tflops.csv").read_text(), "gemm-tflops.csv")
    profile = calibrate_profile(A100, 2, 4, (4, 2), runs, gemms=gemms, gemm_source="gemm-tflops.csv").profile
    assert profile.device.matmul_efficiency == pytest.approx(GEMM_TFLOPS_CEILING, rel=1e-3)
    assert profile.device.compute_units == A100.device.compute_units
    assert profile.sources["device.matmul_efficiency"].startswith("gemm-tflops.csv: 9 GEMMs")


def test_a_table_of_memory_bound_gemms_measures_no_ceiling():
    thin = parse_gemm_table("m,n,k,dtype,tflops\n1,8192,8192,bf16,1.0\n", "thin.csv")
    with pytest.raises(ConfigError, match="under its memory roofline") as e:
        fit_gemm_ceiling(thin, A100.device)
    assert e.value.code == "bad_gemm_table"


# ------------------------------------------------------------------ bad input


def _row_line(text: str, size: int) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.split() and ln.split()[0] == str(size))


def _replace_line(text: str, lineno: int, new: str) -> str:
    lines = text.splitlines()
    lines[lineno - 1] = new
    return "\n".join(lines) + "\n"


def test_bad_rows_name_the_file_and_line():
    text = (RESULTS / "axis0" / "all_reduce_perf.txt").read_text()
    line = _row_line(text, 4096)
    original = text.splitlines()[line - 1]
    cases = {
        original.replace(original.split()[5], "fast", 1): "must be numbers",
        " ".join(original.split()[:9]): "has 9",
        original[: original.rfind("0")] + "7": "#wrong = 7",
    }
    for bad, message in cases.items():
        with pytest.raises(ConfigError, match=message) as e:
            parse_nccl_tests(_replace_line(text, line, bad), "axis0/all_reduce_perf.txt")
        assert e.value.code == "bad_nccl_output"
        assert f"axis0/all_reduce_perf.txt:{line}:" in str(e.value)
        assert e.value.details["line"] == line


def test_failed_validation_and_empty_outputs_are_rejected():
    text = (RESULTS / "axis0" / "all_reduce_perf.txt").read_text()
    failed = text.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 12 FAILED")
    with pytest.raises(ConfigError, match="12 wrong values") as e:
        parse_nccl_tests(failed, "f")
    assert e.value.code == "bad_nccl_output" and e.value.details["line"] > 1
    header_only = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    with pytest.raises(ConfigError, match="no result rows") as e:
        parse_nccl_tests(header_only, "f")
    assert e.value.code == "bad_nccl_output"


def test_output_of_another_collective_or_group_is_caught():
    ag = parse_nccl_tests(
        (RESULTS / "axis0" / "all_gather_perf.txt").read_text(), "axis0/all_reduce_perf.txt"
    )
    expected = r"busbw / algbw = 0\.7\d+ but all-reduce on 4 ranks has 1\.500"
    with pytest.raises(ConfigError, match=expected) as e:
        calibrate_collective(ag, "all-reduce", 4)
    assert e.value.code == "collective_mismatch" and e.value.details["line"] > 0
    axis0 = parse_nccl_tests((RESULTS / "axis0" / "all_reduce_perf.txt").read_text(), "a")
    with pytest.raises(ConfigError, match="4 ranks in rank 0's group but the mesh axis has 2") as e:
        calibrate_collective(axis0, "all-reduce", 2)
    assert e.value.code == "rank_mismatch"


def test_only_large_sizes_cannot_fit_a_latency():
    run = parse_nccl_tests(
        render("all-reduce", Link(-50e-6, 20e9), split_mask=0x1, min_bytes=1 << 28, noise=0.0)
    )
    with pytest.raises(ConfigError, match="scan from small sizes") as e:
        calibrate_collective(run, "all-reduce", 4)
    assert e.value.code == "bad_nccl_fit"


def test_bad_tables_name_the_line():
    with pytest.raises(ConfigError, match=r"g\.csv:3: dtype 'float32'") as e:
        parse_gemm_table(
            "m,n,k,dtype,seconds\n1024,1024,1024,bf16,1e-5\n1024,1024,1024,float32,1e-4\n", "g.csv"
        )
    assert e.value.code == "bad_gemm_table" and e.value.details["line"] == 3
    with pytest.raises(ConfigError, match=r"g\.csv:1: header lacks column\(s\) \['seconds'\]"):
        parse_gemm_table("m,n,k,dtype,time\n", "g.csv")
    with pytest.raises(ConfigError, match="both seconds and tflops"):
        parse_gemm_table("m,n,k,dtype,seconds,tflops\n1,1,1,bf16,1,1\n", "g.csv")
    with pytest.raises(ConfigError, match=r"g\.csv:2: batch, m, n, k must be >= 1 and tflops > 0"):
        parse_gemm_table("batch,m,n,k,dtype,tflops\n0,1024,1024,1024,bf16,100\n", "g.csv")
    with pytest.raises(ConfigError, match=r"c\.csv:2: bytes and seconds must be numbers") as e:
        parse_copy_table("bytes,seconds\n1MiB,1e-3\n", "c.csv")
    assert e.value.code == "bad_copy_table"


def test_results_dir_layout_errors(tmp_path: Path):
    with pytest.raises(ConfigError) as e:
        read_results_dir(tmp_path)
    assert e.value.code == "no_measurements"
    (tmp_path / "axis0").mkdir()
    (tmp_path / "axis0" / "allreduce_perf.txt").write_text("")
    with pytest.raises(ConfigError, match="'allreduce_perf' is not an nccl-tests binary") as e:
        read_results_dir(tmp_path)
    assert e.value.code == "unknown_nccl_test"
    with pytest.raises(ConfigError, match="mesh axis 2") as e:
        calibrate_profile(A100, 2, 4, (4, 2), {2: read_results_dir(RESULTS)[0]})
    assert e.value.code == "bad_axis"


# ------------------------------------------------------------------ CLI


def test_cli_calibrate_then_price_a_baseline_with_the_profile(tmp_path: Path, capsys):
    out = tmp_path / "profile.json"
    rc = main(
        [
            "calibrate",
            str(RESULTS),
            "--cluster",
            "2x4",
            "--mesh-shape",
            "4,2",
            "--gemm-table",
            str(FIXTURES / "gemm.csv"),
            "--copy-table",
            str(FIXTURES / "copy.csv"),
            "--name",
            "lab-a100",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "axis 0 (4 ranks, crosses nodes)" in printed and "axis 1 (2 ranks, inside a node)" in printed
    profile = load_cluster_profile(out)
    assert profile.name == "lab-a100" and profile.device.matmul_efficiency == pytest.approx(0.6, rel=1e-3)

    graph_path = tmp_path / "g.json"
    mlp_graph(layers=2).save(str(graph_path))
    common = ["megatron", str(graph_path), "--cluster", "2x4", "--mesh-shape", "4,2"]
    assert main(["baseline", *common, "--out", str(tmp_path / "preset.json")]) == 0
    assert (
        main(["baseline", *common, "--cluster-profile", str(out), "--out", str(tmp_path / "cal.json")]) == 0
    )
    preset_plan = json.loads((tmp_path / "preset.json").read_text())
    calibrated_plan = json.loads((tmp_path / "cal.json").read_text())
    assert calibrated_plan["mesh"]["cluster"]["device"]["name"] == "lab-a100"
    assert preset_plan["mesh"]["cluster"]["device"]["name"] == "a100-40g"
    capsys.readouterr()
    # evaluate re-prices the preset plan on the profile: the same numbers as the calibrated baseline
    assert main(["evaluate", str(graph_path), str(tmp_path / "preset.json"), "--json"]) == 0
    on_preset = json.loads(capsys.readouterr().out)
    assert (
        main(
            [
                "evaluate",
                str(graph_path),
                str(tmp_path / "preset.json"),
                "--json",
                "--cluster-profile",
                str(out),
            ]
        )
        == 0
    )
    on_profile = json.loads(capsys.readouterr().out)
    assert main(["evaluate", str(graph_path), str(tmp_path / "cal.json"), "--json"]) == 0
    assert on_profile["step_time_s"] == pytest.approx(json.loads(capsys.readouterr().out)["step_time_s"])
    assert on_profile["step_time_s"] != pytest.approx(on_preset["step_time_s"])


def test_cli_errors_are_one_line(tmp_path: Path, capsys):
    bad = tmp_path / "r" / "axis0"
    bad.mkdir(parents=True)
    text = (RESULTS / "axis0" / "all_reduce_perf.txt").read_text()
    line = _row_line(text, 1024)
    (bad / "all_reduce_perf.txt").write_text(_replace_line(text, line, "1024 256 float sum -1 oops"))
    rc = main(
        ["calibrate", str(tmp_path / "r"), "--cluster", "2x4", "--mesh-shape", "4,2", "--out", "x.json"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("autopar: error: [bad_nccl_output]") and f"all_reduce_perf.txt:{line}:" in err
    (tmp_path / "p.json").write_text('{"format": "autopar-cluster-profile",\n "version": 1,\n')
    mlp_graph().save(str(tmp_path / "g.json"))
    graph = str(tmp_path / "g.json")
    rc = main(["baseline", "megatron", graph, "--cluster-profile", str(tmp_path / "p.json"), "--out", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and "[bad_profile]" in err and "p.json:3:" in err


@pytest.mark.slow
def test_cli_plan_takes_the_profile(tmp_path: Path, capsys):
    pytest.importorskip("ortools")
    profile = tmp_path / "lab.json"
    calibrated().save(profile)
    graph = tmp_path / "g.json"
    mlp_graph().save(str(graph))
    args = [
        "plan",
        str(graph),
        "--cluster",
        "2x4",
        "--mesh-shape",
        "4,2",
        "--stages",
        "1",  # the profile's use is checked, not the stage search (which splits the limit)
        "--time-limit",
        "120",  # a cap far above the solve, so a loaded machine cannot change the verdict
        "--no-progress",
    ]
    assert main([*args, "--cluster-profile", str(profile), "--out", str(tmp_path / "p.json")]) == 0
    assert "over 2x4 a100-40g-calibrated" in capsys.readouterr().out
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["mesh"]["cluster"]["links"]["mesh_axes"][0]["mesh_shape"] == [4, 2]


def test_compute_only_calibration_keeps_the_base_links(tmp_path, capsys):
    out = tmp_path / "compute.json"
    rc = main(["calibrate", "--gemm-table", str(FIXTURES / "gemm-tflops.csv"), "--out", str(out)])
    assert rc == 0
    assert "compute only" in capsys.readouterr().out
    profile = load_cluster_profile(out)
    assert profile.device.matmul_efficiency == pytest.approx(GEMM_TFLOPS_CEILING, rel=1e-3)
    assert profile.links == A100.links
    assert profile.device.intra_node_bandwidth == A100.device.intra_node_bandwidth
    assert "from GEMM timings" in profile.description


def test_calibrate_needs_a_measurement_and_results_need_their_mesh(tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "p.json")]) != 0
    assert "no_measurements" in capsys.readouterr().err
    assert main(["calibrate", str(RESULTS), "--out", str(tmp_path / "p.json")]) != 0
    assert "--mesh-shape" in capsys.readouterr().err
