import pytest

from autopar.errors import ConfigError
from autopar.hardware.cluster import PRESETS, Cluster
from autopar.hardware.mesh import Mesh, candidate_mesh_shapes, parse_mesh_shape


def test_presets_exist():
    assert {"a100-40g", "a100-80g", "h100-80g", "v100-32g"} <= set(PRESETS)
    assert PRESETS["h100-80g"].peak_flops > PRESETS["a100-40g"].peak_flops > PRESETS["v100-32g"].peak_flops


def test_parse_cluster_and_errors():
    c = Cluster.parse("2x4", "h100-80g")
    assert c.world_size == 8 and c.device.name == "h100-80g"
    with pytest.raises(ConfigError, match="NODESxDEVICES") as e:
        Cluster.parse("eight")
    assert e.value.code == "bad_cluster"
    with pytest.raises(ConfigError, match="unknown device preset") as e:
        Cluster.parse("2x4", "tpu")
    assert e.value.code == "unknown_preset"


def test_mesh_must_cover_cluster_with_numbers_in_message():
    with pytest.raises(ConfigError, match=r"mesh shape \[3, 2\] has 6 devices but cluster 2x4 has 8"):
        Mesh(Cluster.parse("2x4"), (3, 2))


def test_candidate_shapes_2x4():
    assert candidate_mesh_shapes(Cluster.parse("2x4")) == [(8,), (2, 4), (4, 2), (2, 2, 2)]
    assert len(candidate_mesh_shapes(Cluster.parse("4x8"))) == 11  # 1 + 4 + 6 ordered ones
    assert candidate_mesh_shapes(Cluster.parse("2x4"), max_axes=2) == [(8,), (2, 4), (4, 2)]


def test_parse_mesh_shape():
    assert parse_mesh_shape("4,2") == (4, 2)
    assert parse_mesh_shape("[2, 4]") == (2, 4)
    with pytest.raises(ConfigError):
        parse_mesh_shape("4x2")


def test_cluster_dict_round_trip():
    c = Cluster.parse("2x4", "v100-32g")
    assert Cluster.from_dict(c.to_dict()) == c
    m = Mesh(c, (4, 2))
    assert Mesh.from_dict(m.to_dict()) == m


def test_device_validation():
    from dataclasses import replace

    with pytest.raises(ConfigError, match="matmul_efficiency"):
        replace(PRESETS["a100-40g"], matmul_efficiency=1.5)
    with pytest.raises(ConfigError, match="compute_units"):
        replace(PRESETS["a100-40g"], compute_units=-4)


def test_a_profile_without_compute_units_does_not_model_sm_fill(tmp_path):
    import json

    from autopar.hardware.cluster import PROFILES, load_cluster_profile

    data = PROFILES["a100-40g"].to_dict()
    del data["device"]["compute_units"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert load_cluster_profile(path).device.compute_units == 0
    assert PRESETS["a100-40g"].compute_units == 108


# ------------------------------------------------------------------ profiles


def test_presets_are_profiles_citing_a_source_for_every_number():
    from autopar.hardware.cluster import PROFILES

    assert set(PRESETS) == set(PROFILES)
    for name, profile in PROFILES.items():
        assert PRESETS[name] == profile.device
        data = profile.to_dict()
        numbers = (
            [f"device.{k}" for k in data["device"]]
            + [
                f"links.{kind}.{k}"
                for kind in ("intra_node", "inter_node")
                for k in ("latency_s", "bandwidth_bytes_per_s")
            ]
            + [f"links.network.{k}" for k in data["links"]["network"]]
        )
        assert sorted(numbers) == sorted(profile.sources), name
        assert all(profile.sources.values()) and profile.description
        assert not profile.links.measured  # a preset has no per-collective fits
        # a device's send/recv across nodes is the same number either way it is read
        network = profile.links.network
        assert network is not None
        assert profile.device.inter_node_bandwidth == pytest.approx(network.point_to_point_per_device)


def test_preset_links_have_no_fits_so_collectives_use_latency_and_bandwidth():
    from autopar.hardware.collectives import all_gather_time, all_reduce_time, send_recv_time

    link = Mesh(Cluster.parse("2x4"), (2, 4)).axes[1]  # inside a node: the intra-node link alone
    assert link.alpha_beta("all-reduce") == link.alpha_beta("send-recv") == (link.latency, link.bandwidth)
    assert all_reduce_time(1e6, link) == 2 * 3 * link.latency + 2 * 3 / 4 * 1e6 / link.bandwidth
    assert link.bandwidth == PRESETS["a100-40g"].intra_node_bandwidth
    assert send_recv_time(1e6, link) == link.latency + 1e6 / link.bandwidth
    assert send_recv_time(1e6, Mesh(Cluster.parse("1x1"), (1,)).axes[0]) == 0
    # a fit for one collective changes that collective only
    from dataclasses import replace

    from autopar.hardware.links import CollectiveFit, LinkCosts

    fitted = replace(link, collectives=LinkCosts(all_gather=CollectiveFit(1e-6, 2 * link.bandwidth)))
    assert all_reduce_time(1e6, fitted) == all_reduce_time(1e6, link)
    assert all_gather_time(1e6, fitted) < all_gather_time(1e6, link)
    assert send_recv_time(1e6, fitted) == send_recv_time(1e6, link)


def test_profile_files_are_checked_field_by_field(tmp_path):
    import json

    from autopar.hardware.cluster import PROFILES, load_cluster_profile

    good = PROFILES["a100-40g"].to_dict()
    cases = [
        ({**good, "format": "something"}, "not a cluster profile"),
        (
            {**good, "device": {**good["device"], "peak_flop": 1.0}},
            r"profile\.device: unknown field\(s\) \['peak_flop'\]",
        ),
        (
            {**good, "device": {**good["device"], "peak_flops": "fast"}},
            r"profile\.device\.peak_flops must be a number",
        ),
        ({**good, "device": {**good["device"], "memory_efficiency": 1.5}}, "memory_efficiency must be in"),
        ({**good, "device": {**good["device"], "compute_units": 10.5}}, "compute_units must be a whole"),
        (
            {**good, "device": {**good["device"], "compute_units": -1}},
            "compute_units must be an integer >= 0",
        ),
        (
            {**good, "links": {**good["links"], "inter_node": {"latency_s": 1e-5}}},
            r"links\.inter_node: missing field 'bandwidth_bytes_per_s'",
        ),
        (
            {
                **good,
                "links": {
                    **good["links"],
                    "intra_node": {**good["links"]["intra_node"], "collectives": {"broadcast": {}}},
                },
            },
            r"unknown field\(s\) \['broadcast'\]",
        ),
    ]
    for data, message in cases:
        path = tmp_path / "p.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=message) as e:
            load_cluster_profile(path)
        assert e.value.code in ("bad_profile", "bad_device")
    path.write_text('{\n "format": "autopar-cluster-profile",\n "version": 1\n "name": "x"}')
    with pytest.raises(ConfigError, match=r"p\.json:4: not valid JSON") as e:
        load_cluster_profile(path)
    assert e.value.code == "bad_profile" and e.value.details["line"] == 4
    with pytest.raises(ConfigError) as e:
        load_cluster_profile(tmp_path / "missing.json")
    assert e.value.code == "profile_not_found"


def test_parse_with_a_profile_uses_its_device_and_links():
    from autopar.hardware.cluster import PROFILES

    profile = PROFILES["h100-80g"]
    assert Cluster.parse("2x4", profile=profile) == Cluster.parse("2x4", "h100-80g")
    assert Cluster.parse("2x4", None) == Cluster.parse("2x4", "a100-40g")  # the default preset
