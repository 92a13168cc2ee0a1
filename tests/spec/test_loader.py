"""Cluster files: the shipped default, round trips, and one clear SpecError per kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import SpecError
from gpufleet.spec import ClusterSpec, cluster_from_dict, cluster_to_dict, default_cluster_path, load_cluster

GOOD = """\
name = "philly-like"

[network]
oversubscription = 2.0

[[pools]]
name = "train"
kind = "training"
gpu = "v100"
gpus_per_node = 8
nodes = 48
nic = "ib-edr"
nodes_per_rack = 16
"""

CLUSTER_DIR = default_cluster_path().parent


def _write(tmp_path: Path, text: str, name: str = "cluster.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_default_cluster_has_documented_numbers() -> None:
    assert default_cluster_path().is_file()
    c = load_cluster()
    assert c == load_cluster(default_cluster_path())
    train, infer = c.pool("train"), c.pool("infer")
    assert (train.kind, train.gpu, train.gpus_per_node, train.nodes) == ("training", "v100", 8, 80)
    assert (train.nic, train.nodes_per_rack, train.racks) == ("ib-edr", 16, 5)
    assert (infer.kind, infer.gpu, infer.gpus_per_node, infer.nodes, infer.nic) == (
        "inference",
        "t4",
        8,
        96,
        "roce-100g",
    )
    assert c.network.oversubscription == 2.0
    assert c.total_gpus() == 640
    assert c.total_gpus("inference") == 768


@pytest.mark.parametrize("path", sorted(CLUSTER_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_cluster_loads(path: Path) -> None:
    c = load_cluster(path)
    assert c.total_gpus() > 0


def test_load_good_file_and_str_path(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    c = load_cluster(str(path))
    assert c.name == "philly-like"
    assert c.total_gpus() == 384
    assert c.pools[0].nics_per_node == 1  # default
    assert c.inference_pools == ()


def test_dict_round_trip() -> None:
    c = load_cluster()
    d = cluster_to_dict(c)
    assert isinstance(d["pools"], list)
    assert cluster_from_dict(d) == c
    assert cluster_from_dict(c.model_dump()) == c


def test_round_trip_keeps_spine_capacity() -> None:
    c = ClusterSpec.model_validate(
        {
            "name": "s",
            "network": {"spine_gbps": 12800.0},
            "pools": [{"name": "t", "kind": "training", "gpu": "h100", "nodes": 2}],
        }
    )
    assert cluster_from_dict(cluster_to_dict(c)) == c


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_cluster(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg  # names the file first
    assert "\n" not in msg  # one line for the CLI
    return msg


def test_wrong_type_names_key(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("gpus_per_node = 8", 'gpus_per_node = "eight"'))
    assert "pools[0].gpus_per_node: expected a whole number, got 'eight'" in msg


def test_float_for_int_names_key(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("nodes = 48", "nodes = 47.5"))
    assert "pools[0].nodes: expected a whole number" in msg


def test_missing_key_names_key_and_fix(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("nodes = 48\n", ""))
    assert "pools[0].nodes: required key is missing; add `nodes = ...` to pools[0]" in msg


def test_missing_top_level_name(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace('name = "philly-like"\n', ""))
    assert "name: required key is missing" in msg and "top level" in msg


def test_unknown_gpu_names_key_and_suggests(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace('gpu = "v100"', 'gpu = "v1000"'))
    assert "pools[0].gpu: unknown GPU 'v1000' (did you mean 'v100'?)" in msg
    assert "valid GPU names:" in msg


def test_unknown_nic_names_key(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace('nic = "ib-edr"', 'nic = "ib-xdr"'))
    assert "pools[0].nic: unknown NIC 'ib-xdr'" in msg


def test_duplicate_pool_names(tmp_path: Path) -> None:
    second = GOOD[GOOD.index("[[pools]]") :].replace('kind = "training"', 'kind = "inference"')
    msg = _error(tmp_path, GOOD + "\n" + second)
    assert "pools: pool name 'train' is used by pools[0] and pools[1]" in msg
    assert "unique" in msg


def test_syntax_error_names_position(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("nodes = 48", "nodes 48"))
    assert "not valid TOML" in msg
    assert "line 11" in msg


def test_unknown_key_suggests_spelling(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("gpus_per_node = 8", "gpus_per_nod = 8"))
    assert "pools[0].gpus_per_nod: unknown key (did you mean `gpus_per_node`?)" in msg


def test_misspelt_table_name(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("[network]", "[netwrok]"))
    assert "netwrok: unknown key (did you mean `network`?)" in msg


def test_bad_kind_and_oversubscription(tmp_path: Path) -> None:
    text = GOOD.replace('kind = "training"', 'kind = "train"').replace(
        "oversubscription = 2.0", "oversubscription = 0.5"
    )
    msg = _error(tmp_path, text)
    assert "2 problems" in msg  # several problems still make one message
    assert "network.oversubscription: must be at least 1" in msg
    assert "pools[0].kind: must be one of 'training' or 'inference', got 'train'" in msg


def test_non_positive_count(tmp_path: Path) -> None:
    msg = _error(tmp_path, GOOD.replace("nodes = 48", "nodes = 0"))
    assert "pools[0].nodes: must be greater than 0, got 0" in msg


def test_no_pools(tmp_path: Path) -> None:
    msg = _error(tmp_path, 'name = "empty"\npools = []\n')
    assert "pools: needs at least 1 entry" in msg


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(SpecError, match=r"nope\.toml: cluster file not found"):
        load_cluster(path)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="is a directory"):
        load_cluster(tmp_path)


def test_cluster_from_dict_names_source() -> None:
    with pytest.raises(SpecError, match=r"^<dict>: pools: required key is missing"):
        cluster_from_dict({"name": "x"})
    with pytest.raises(SpecError, match=r"^cli: "):
        cluster_from_dict({"name": "x", "pools": "no"}, source="cli")
    with pytest.raises(SpecError, match="must be a table"):
        cluster_from_dict(["not", "a", "dict"])  # type: ignore[arg-type]


def test_shipped_clusters_load_by_name() -> None:
    spec = load_cluster("deepshare-testbed")
    assert spec.total_gpus() == 32
    with pytest.raises(SpecError, match="deepshare-testbed"):
        load_cluster("no-such-cluster")  # the error lists the shipped names
