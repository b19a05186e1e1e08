import pytest

from autopar.cluster import PRESETS, Cluster, Mesh, candidate_mesh_shapes, parse_mesh_shape
from autopar.errors import ConfigError


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
    assert candidate_mesh_shapes(Cluster.parse("2x4")) == [(8,), (2, 4), (4, 2)]


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
