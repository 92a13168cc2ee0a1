"""Pool, Network and ClusterSpec: derived quantities, validation, resizing and the single-pool shortcut."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpufleet.errors import SpecError
from gpufleet.spec import ClusterSpec, Network, Pool


def _pool(**kw: object) -> Pool:
    base: dict[str, object] = {"name": "train", "kind": "training", "gpu": "a100-80g", "nodes": 4}
    base.update(kw)
    return Pool.model_validate(base)


def test_pool_defaults_and_derived_numbers() -> None:
    p = _pool(nodes=20)
    assert (p.gpus_per_node, p.nic, p.nics_per_node, p.nodes_per_rack) == (8, "ib-hdr", 1, 16)
    assert p.total_gpus == 160
    assert p.racks == 2  # 16 + 4: the partly filled rack counts
    assert p.gpu_spec.name == "a100-80g"
    assert p.nic_spec.gbps == 200
    assert p.node_gbps == 200
    assert p.rack_downlink_gbps == 16 * 200


def test_pool_racks_is_ceiling() -> None:
    assert _pool(nodes=16, nodes_per_rack=16).racks == 1
    assert _pool(nodes=17, nodes_per_rack=16).racks == 2
    assert _pool(nodes=1, nodes_per_rack=16).racks == 1


def test_pool_canonicalises_catalog_names() -> None:
    p = _pool(gpu="NVIDIA A100-SXM4-80GB", nic="HDR")
    assert (p.gpu, p.nic) == ("a100-80g", "ib-hdr")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus_per_node", 0),
        ("nodes", -1),
        ("nics_per_node", 0),
        ("nodes_per_rack", 0),
        ("kind", "batch"),
        ("gpu", "b200x"),
        ("nic", "carrier-pigeon"),
        ("name", ""),
    ],
)
def test_pool_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        _pool(**{field: value})


def test_pool_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        _pool(gpus=8)


def test_network_validation_and_uplink() -> None:
    assert Network().oversubscription == 1.0 and Network().spine_gbps is None
    with pytest.raises(ValidationError):
        Network(oversubscription=0.5)
    with pytest.raises(ValidationError):
        Network(spine_gbps=0)
    p = _pool(nic="ib-edr", nodes_per_rack=16)
    assert Network(oversubscription=2.0).rack_uplink_gbps(p) == 16 * 100 / 2


def _cluster() -> ClusterSpec:
    return ClusterSpec(
        name="c",
        pools=(
            _pool(name="a", nodes=10),
            _pool(name="serve", kind="inference", gpu="t4", nodes=5, gpus_per_node=4),
            _pool(name="b", gpu="h100", nodes=3),
        ),
    )


def test_cluster_pool_views_and_totals() -> None:
    c = _cluster()
    assert [p.name for p in c.training_pools] == ["a", "b"]
    assert [p.name for p in c.inference_pools] == ["serve"]
    assert c.total_gpus() == 104
    assert c.total_gpus("training") == 104
    assert c.total_gpus("inference") == 20
    assert c.total_gpus(None) == 124
    assert c.pool("serve").gpu == "t4"
    with pytest.raises(SpecError, match="no pool 'x'"):
        c.pool("x")
    with pytest.raises(SpecError, match="unknown pool kind"):
        c.total_gpus("train")


def test_cluster_needs_pools_with_unique_names() -> None:
    with pytest.raises(ValidationError):
        ClusterSpec(name="c", pools=())
    with pytest.raises(ValidationError, match=r"used by pools\[0\] and pools\[1\]"):
        ClusterSpec(name="c", pools=(_pool(name="x"), _pool(name="x", kind="inference")))


def test_cluster_is_frozen_and_hashable() -> None:
    c = _cluster()
    with pytest.raises(ValidationError):
        c.name = "other"  # type: ignore[misc]
    assert hash(c) == hash(_cluster())
    assert c == _cluster()


def test_resized_to_current_size_is_identity() -> None:
    c = _cluster()
    assert c.resized(c.total_gpus()) == c


def test_resized_keeps_inference_pools_network_and_order() -> None:
    c = _cluster()
    r = c.resized(1000)
    assert [p.name for p in r.pools] == ["a", "serve", "b"]
    assert r.pool("serve") == c.pool("serve")
    assert r.network == c.network
    assert r.total_gpus() >= 1000


def test_resized_errors() -> None:
    with pytest.raises(SpecError, match="positive"):
        _cluster().resized(0)
    only_inference = ClusterSpec(name="i", pools=(_pool(kind="inference"),))
    with pytest.raises(SpecError, match="no training pool"):
        only_inference.resized(64)


_pools = st.lists(
    st.tuples(st.integers(1, 200), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from(["training", "inference"])),
    min_size=1,
    max_size=5,
).filter(lambda ps: any(kind == "training" for _, _, kind in ps))


@settings(max_examples=300, deadline=None)
@given(pools=_pools, requested=st.integers(1, 20_000))
def test_resized_properties(pools: list[tuple[int, int, str]], requested: int) -> None:
    c = ClusterSpec(
        name="h",
        pools=tuple(_pool(name=f"p{i}", nodes=n, gpus_per_node=g, kind=k) for i, (n, g, k) in enumerate(pools)),
    )
    r = c.resized(requested)
    total = r.total_gpus("training")
    assert total >= requested
    assert r.total_gpus("inference") == c.total_gpus("inference")
    factor = requested / c.total_gpus("training")
    for old, new in zip(c.pools, r.pools, strict=True):
        assert isinstance(new.nodes, int) and new.nodes >= 1
        assert new.total_gpus == new.nodes * new.gpus_per_node  # whole nodes only
        assert new.model_copy(update={"nodes": old.nodes}) == old  # only the node count changes
        if old.kind == "inference":
            assert new == old
        else:
            ideal = old.nodes * factor
            # Proportional: each pool is within one node of its exact share (or at its minimum of one).
            assert abs(new.nodes - ideal) < 1 + 1e-9 or new.nodes == 1
    if all(p.nodes * factor >= 1 for p in c.training_pools):
        # Tight: no more than one (largest) node beyond the request.
        assert total - requested < max(p.gpus_per_node for p in c.training_pools)


def test_single_pool() -> None:
    c = ClusterSpec.single_pool(100)
    assert c.name == "custom"
    assert len(c.pools) == 1 and c.pools[0].kind == "training" and c.pools[0].gpu == "v100"
    assert c.pools[0].nodes == math.ceil(100 / 8) == 13
    assert c.total_gpus() == 104
    c2 = ClusterSpec.single_pool(64, gpu="H100", gpus_per_node=4, name="mine")
    assert (c2.name, c2.pools[0].gpu, c2.pools[0].nodes, c2.total_gpus()) == ("mine", "h100", 16, 64)


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"gpus": 0}, "gpus must be"),
        ({"gpus": 8, "gpu": "h1000"}, "h100"),
        ({"gpus": 8, "gpus_per_node": -8}, "gpus_per_node"),
    ],
)
def test_single_pool_errors(kw: dict[str, object], pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern):
        ClusterSpec.single_pool(**kw)  # type: ignore[arg-type]


def test_cluster_pickles_for_worker_processes() -> None:
    import pickle

    c = _cluster()
    assert pickle.loads(pickle.dumps(c)) == c
