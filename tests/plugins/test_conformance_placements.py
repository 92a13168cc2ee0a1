"""Every registered placement, under a non-preemptive and a preemptive order on a tiny cluster: it constructs,
declares what it needs, finishes every job, rejects an unknown option in one line, and composes with every
capacity policy (the Aryl variants, on a cluster with an inference pool). A new placement file is picked up."""

from __future__ import annotations

import pytest
from test_conformance_policies import JOBS, NEEDS, _cluster  # a sibling: pytest puts this folder on sys.path

from gpufleet.errors import ConfigError
from gpufleet.sched.placement.base import PLACEMENTS, Placement, make_placement
from gpufleet.sched.policy import make_scheduler, pair_label
from gpufleet.sim.config import SimConfig
from gpufleet.sim.run import RunSpec, pair_runs, run_one

ORDERS = ("sjf", "srtf", "tiresias")


@pytest.mark.parametrize("name", PLACEMENTS.plugin_names())
def test_placement_declares_itself(name: str) -> None:
    cls = PLACEMENTS[name]
    assert issubclass(cls, Placement) and cls.name == name
    assert cls.summary and "\n" not in cls.summary, "a placement needs a one-line summary for --help"
    assert set(cls.needs) <= NEEDS
    assert all(isinstance(v, (float, str)) for v in cls.options.values())


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", PLACEMENTS.plugin_names())
def test_placement_finishes_every_job_under_any_order(name: str, order: str) -> None:
    cls = PLACEMENTS[name]
    config = SimConfig(network="network" in cls.needs, debug=True)
    jobs = JOBS if config.network else JOBS.drop("model")
    label = pair_label(order, name)
    result = run_one(RunSpec(label, jobs, _cluster(False), config))
    assert result.summary["finished"] == JOBS.height
    assert result.summary["policy"] == order and result.summary["placement"] == name
    assert result.policy == (order if name == "consolidate" else f"{order}+{name}")
    out = result.jobs
    assert (out["finish_s"] >= out["submit_s"] - 1e-9).all()


@pytest.mark.parametrize("name", PLACEMENTS.plugin_names())
def test_placement_rejects_an_unknown_option_in_one_line(name: str) -> None:
    make_placement(name)
    with pytest.raises(ConfigError) as info:
        make_placement(name, no_such_option=1.0)
    assert "no_such_option" in str(info.value) and "\n" not in str(info.value)


ARYL = ("aryl", "aryl-loan", "aryl-elastic", "aryl-base")


@pytest.mark.parametrize("aryl", ARYL)
@pytest.mark.parametrize("name", PLACEMENTS.plugin_names())
def test_placement_composes_with_every_capacity_policy(name: str, aryl: str) -> None:
    """Under Aryl a GPU-level placement picks the base demand's servers: every job finishes, the cluster stays
    consistent (debug mode checks it on every event), and the row names both layers."""
    policy = make_scheduler(f"{aryl}+{name}")
    assert policy.placement == name
    cls = PLACEMENTS[name]
    config = SimConfig(network="network" in cls.needs, debug=True)
    jobs = JOBS if config.network else JOBS.drop("model")
    result = run_one(RunSpec(pair_label(aryl, name), jobs, _cluster(True), config))
    assert result.summary["finished"] == JOBS.height
    assert result.summary["policy"] == aryl and result.summary["placement"] == name


def test_pairs_cover_every_policy_and_placement_with_plain_default_names() -> None:
    assert pair_runs(["fifo", "srtf"], ["consolidate", "rl"]) == ["fifo", "fifo+rl", "srtf", "srtf+rl"]
    assert pair_runs(["las-spread"], None) == ["las-spread"]
    assert pair_runs(["las-spread"], ["spread"]) == ["las-spread"]  # an alias's own placement keeps its name


def test_unknown_placement_name_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"^unknown placement 'sprad'\. Did you mean 'spread'\? Available: "):
        make_placement("sprad")


@pytest.mark.parametrize(("alias", "pair"), [("las-spread", "las+spread"), ("srtf-spread", "srtf+spread")])
def test_spread_aliases_equal_their_pairs(alias: str, pair: str) -> None:
    config = SimConfig(debug=True)
    jobs = JOBS.drop("model")
    a = run_one(RunSpec(alias, jobs, _cluster(False), config))
    b = run_one(RunSpec(pair, jobs, _cluster(False), config))
    assert a.jobs.drop("preemptions").equals(b.jobs.drop("preemptions")) and a.jobs.equals(b.jobs)
    assert a.summary["placement"] == b.summary["placement"] == "spread"


def test_a_waiting_placement_under_a_preemptive_order_finishes_every_job() -> None:
    config = SimConfig(network=True, debug=True)
    opts = {"wait_below": 0.99}
    result = run_one(RunSpec("srtf+contention", JOBS, _cluster(False), config, placement_opts=opts))
    assert result.summary["finished"] == JOBS.height
