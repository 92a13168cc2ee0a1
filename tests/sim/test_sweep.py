"""Policy sweeps give the same results serially, over a process pool, and on a local Ray instance."""

from __future__ import annotations

import pytest
from helpers import jobs_frame

from gpufleet.errors import ConfigError
from gpufleet.sim.config import SimConfig
from gpufleet.sim.run import parse_policy_opts, run_policies
from gpufleet.spec import ClusterSpec

ROWS = [(float(i * 37 % 400), float(30 + i * 53 % 700), [1, 2, 4, 8, 16][i % 5]) for i in range(300)]
POLICIES = ["fifo", "sjf", "srtf", "las", "tiresias"]


@pytest.fixture(scope="module")
def serial():
    return run_policies(jobs_frame(ROWS), ClusterSpec.single_pool(32), POLICIES, SimConfig())


def test_process_pool_matches_serial(serial):
    pooled = run_policies(jobs_frame(ROWS), ClusterSpec.single_pool(32), POLICIES, SimConfig(), workers=2)
    assert [r.policy for r in pooled] == POLICIES
    for a, b in zip(serial, pooled, strict=False):
        assert a.jobs.equals(b.jobs)


def test_ray_local_matches_serial(serial):
    pytest.importorskip("ray")  # the dev extra installs it; the ray extra is optional for users
    results = run_policies(
        jobs_frame(ROWS), ClusterSpec.single_pool(32), ["fifo", "tiresias"], SimConfig(), ray_address="local"
    )
    assert results[0].jobs.equals(serial[0].jobs)
    assert results[1].jobs.equals(serial[4].jobs)


def test_policy_options_are_parsed_and_validated():
    opts = parse_policy_opts(["las.quantum_gpu_s=600", "tiresias.thresholds=100,1000"], ["las", "tiresias"])
    assert opts["las"] == {"quantum_gpu_s": 600.0}
    assert opts["tiresias"] == {"thresholds": "100,1000"}
    with pytest.raises(ConfigError, match=r"POLICY\.OPTION=VALUE"):
        parse_policy_opts(["quantum=3"], ["las"])
    with pytest.raises(ConfigError, match="needs a number"):
        parse_policy_opts(["las.quantum_gpu_s=abc"], ["las"])


def _placement_sweep(**kw):
    """Orders x placements (incl. Aryl with a GPU-level placement and two seeds of random) with the network on."""
    import polars as pl

    from gpufleet.spec.loader import cluster_from_dict

    models = ["FSDP", "MoE", "DLRM", "GraphSage", "MobileNetV3"]
    jobs = jobs_frame(ROWS[:120]).with_columns(pl.Series("model", [models[i % 5] for i in range(120)]))
    pools = [
        {"name": "t", "kind": "training", "gpu": "v100", "gpus_per_node": 8, "nodes": 4, "nic": "ib-edr"},
        {"name": "i", "kind": "inference", "gpu": "t4", "gpus_per_node": 8, "nodes": 2},
    ]
    cluster = cluster_from_dict({"name": "two", "pools": pools})
    labels = ["srtf", "srtf+contention", "tiresias+random", "aryl", "aryl+contention", "aryl-base+spread"]
    opts = {"random": {"seed": 3.0}}
    return run_policies(jobs, cluster, labels, SimConfig(network=True), opts, **kw)


def test_a_placement_sweep_is_the_same_serially_on_a_pool_and_on_ray():
    serial = _placement_sweep()
    pooled = _placement_sweep(workers=2)
    assert [r.policy for r in pooled] == [r.policy for r in serial]
    for a, b in zip(serial, pooled, strict=True):
        assert a.jobs.equals(b.jobs), a.policy
    pytest.importorskip("ray")
    on_ray = _placement_sweep(ray_address="local")
    for a, b in zip(serial, on_ray, strict=True):
        assert a.jobs.equals(b.jobs), a.policy
