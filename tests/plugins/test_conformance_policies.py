"""Every registered scheduling policy, run on a tiny cluster: it constructs, finishes every job, declares
what it needs, and rejects an unknown option with a one-line ConfigError. A new policy file is picked up."""

from __future__ import annotations

import polars as pl
import pytest

from gpufleet.errors import ConfigError
from gpufleet.sched.policy import POLICIES, Policy, make_policy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.run import RunSpec, run_one
from gpufleet.spec.loader import cluster_from_dict
from gpufleet.traces.inference import load_inference

NEEDS = {"network"}  # what a run can provide besides jobs and a cluster
ENGINES = {"gang", "elastic"}

#: 10 jobs of 1-16 GPUs over 20 minutes, with the DeepShare model names that only the network model reads
JOBS = pl.DataFrame(
    {
        "job_id": [f"j{i}" for i in range(10)],
        "submit_s": [60.0 * i * i for i in range(10)],
        "duration_s": [600.0, 1200.0, 300.0, 1800.0, 900.0, 400.0, 2400.0, 700.0, 500.0, 1500.0],
        "num_gpus": [8, 4, 1, 16, 2, 8, 4, 2, 1, 8],
        "model": [
            "FSDP",
            "MobileNetV3",
            "Transformer-XL",
            "GraphSage",
            "DLRM",
            "MoE",
            "FSDP",
            "DLRM",
            "MoE",
            "GraphSage",
        ],
    }
)


def _cluster(elastic: bool):
    pools = [
        {
            "name": "train",
            "kind": "training",
            "gpu": "v100",
            "gpus_per_node": 8,
            "nodes": 4,
            "nic": "ib-edr",
            "nodes_per_rack": 2,
        }
    ]
    if elastic:
        pools.append({"name": "infer", "kind": "inference", "gpu": "t4", "gpus_per_node": 8, "nodes": 2})
    return cluster_from_dict({"name": "tiny", "pools": pools})


@pytest.mark.parametrize("name", POLICIES.plugin_names())
def test_policy_declares_itself(name: str) -> None:
    cls = POLICIES[name]
    assert issubclass(cls, Policy) and cls.name == name
    assert cls.summary and "\n" not in cls.summary, "a policy needs a one-line summary for --help"
    assert cls.engine in ENGINES and set(cls.needs) <= NEEDS
    assert all(isinstance(v, (float, str)) for v in cls.options.values())


@pytest.mark.parametrize("name", POLICIES.plugin_names())
def test_policy_finishes_every_job_of_a_tiny_trace(name: str) -> None:
    cls = POLICIES[name]
    elastic = cls.engine == "elastic"
    config = SimConfig(network="network" in cls.needs, debug=True)
    load = load_inference("diurnal", pool_servers=2, until_s=86400.0) if elastic else None
    jobs = JOBS if config.network else JOBS.drop("model")
    result = run_one(RunSpec(name, jobs, _cluster(elastic), config, inference=load))
    jobs = result.jobs.sort("job_id")
    assert result.summary["finished"] == JOBS.height
    assert jobs["job_id"].to_list() == sorted(JOBS["job_id"].to_list())
    assert (jobs["finish_s"] >= jobs["submit_s"] - 1e-9).all()
    assert result.summary["makespan_s"] > 0


@pytest.mark.parametrize("name", POLICIES.plugin_names())
def test_policy_rejects_an_unknown_option_in_one_line(name: str) -> None:
    make_policy(name)  # the defaults construct
    with pytest.raises(ConfigError) as info:
        make_policy(name, no_such_option=1.0)
    message = str(info.value)
    assert "no_such_option" in message and "\n" not in message


def test_unknown_policy_name_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"^unknown policy 'fifoo'\. Did you mean 'fifo'\? Available: .*\bsjf\b"):
        make_policy("fifoo")
