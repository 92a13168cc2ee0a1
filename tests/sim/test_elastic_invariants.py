"""Invariants of the elastic simulator on random small workloads, clusters and inference loads.

Debug mode makes the simulator assert its own state after every event (no server over-allocated, no
training worker on a server inference holds, every job at its base demand while it runs, the group
counters in step); these tests check the results against bounds that hold whatever the policy decides.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from elastic_helpers import ARYL_POLICIES, job_frame, simulate, step_load, two_pool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.sim.config import SimConfig
from gpufleet.sim.elastic_jobs import ElasticConfig
from gpufleet.sim.scaling import PowerLawCurve

ALPHA = PowerLawCurve().alpha
SIZES = [1, 2, 4, 8, 16]


@st.composite
def scenarios(draw):
    """A small two-pool cluster, 5-30 jobs (some elastic) and a step inference load."""
    train_nodes = draw(st.integers(1, 3))
    train_gpus = draw(st.sampled_from([4, 8]))
    infer_nodes = draw(st.integers(1, 3))
    infer_gpus = draw(st.sampled_from([4, 8]))
    n = draw(st.integers(5, 30))
    submit = sorted(draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n)))
    duration = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    # the first job always fits (4 GPUs or fewer); a trace of unschedulable jobs only is its own test
    first = draw(st.sampled_from(SIZES[:3]))
    sizes = [first, *draw(st.lists(st.sampled_from(SIZES), min_size=n - 1, max_size=n - 1))]
    rows = [(float(s), float(d), g) for s, d, g in zip(submit, duration, sizes, strict=True)]
    workers = None
    if draw(st.booleans()):  # elastic by trace columns; otherwise by ElasticConfig.elastic_share
        scale = draw(st.lists(st.sampled_from([1, 1, 2, 4]), min_size=n, max_size=n))
        workers = []
        for g, k in zip(sizes, scale, strict=True):
            per = min(g, train_gpus)
            base = -(-g // per)
            workers.append((base, base * k, per))
    steps = draw(st.integers(1, 5))
    later = draw(st.lists(st.integers(1, 4000), min_size=steps - 1, max_size=steps - 1, unique=True))
    times = [0.0, *sorted(float(t) for t in later)]
    needed = draw(st.lists(st.integers(0, infer_nodes), min_size=steps, max_size=steps))
    return {
        "cluster": two_pool(train_nodes, train_gpus, infer_nodes, infer_gpus),
        "jobs": job_frame(rows, workers),
        "load": step_load(times, needed, pool_servers=infer_nodes),
        "train_nodes": train_nodes,
        "train_gpus": train_gpus,
        "infer_gpus": infer_gpus,
    }


def _fits_training_pool(num_gpus: int, train_nodes: int, train_gpus: int) -> bool:
    """Whether a job's base demand fits the empty training pool (computed without the simulator).

    Workers have ``min(num_gpus, train_gpus)`` GPUs, one server each; the base demand is enough workers
    to cover ``num_gpus`` (the same rule whether the trace gives the columns or the simulator derives them).
    """
    g = min(num_gpus, train_gpus)
    return train_nodes * (train_gpus // g) >= -(-num_gpus // g)


@pytest.mark.parametrize("policy", ARYL_POLICIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=scenarios(),
    ckpt=st.sampled_from([0.0, 0.0, 150.0]),
    restart=st.sampled_from([0.0, 30.0]),
    loan_speed=st.sampled_from([None, 0.5, 1.0]),
    interval=st.sampled_from([100.0, 300.0]),
    pause=st.sampled_from([0.0, 40.0]),
    reclaim=st.sampled_from(["cost", "random", "fewest-jobs"]),
)
def test_invariants_hold_on_random_two_pool_runs(policy, case, ckpt, restart, loan_speed, interval, pause, reclaim):
    cfg = SimConfig(checkpoint_interval_s=ckpt, restart_s=restart, debug=True)
    ecfg = ElasticConfig(elastic_share=0.5, loan_speed=loan_speed, interval_s=interval, scale_pause_s=pause)
    load = case["load"]
    r = simulate(policy, case["jobs"], case["cluster"], cfg, ecfg, load, reclaim=reclaim)
    jobs = r.jobs
    s = r.summary
    n = jobs.height

    # every job whose base demand fits the training pool finishes; the others are reported, not run
    fits = [_fits_training_pool(g, case["train_nodes"], case["train_gpus"]) for g in jobs["num_gpus"].to_list()]
    finished = [not math.isnan(f) for f in jobs["finish_s"].to_list()]
    assert finished == fits
    assert s["finished"] == sum(fits)
    assert s["unschedulable"] == n - sum(fits)

    done = jobs.filter(jobs["finish_s"].is_not_nan())
    submit = done["submit_s"].to_numpy()
    finish = done["finish_s"].to_numpy()
    duration = done["duration_s"].to_numpy()
    wmin = done["min_workers"].to_numpy()
    wmax = done["max_workers"].to_numpy()
    elastic = wmax > wmin
    assert (finish > submit).all()
    assert (done["start_s"].to_numpy() >= submit).all()
    assert (done["queue_s"].to_numpy() >= -1e-6).all()
    # no worker runs faster than a training-server worker (loan speeds here are <= 1), so an inelastic job
    # needs at least its duration; an elastic one at most gains T(max) / T(base)
    assert (finish[~elastic] >= submit[~elastic] + duration[~elastic] - 1e-6).all()
    speedup = (wmax / wmin) ** ALPHA
    assert (finish[elastic] >= submit[elastic] + duration[elastic] / speedup[elastic] - 1e-6).all()
    if policy in ("aryl-base", "aryl-loan"):
        assert not elastic.any()
    assert (done.filter(done["min_workers"] == done["max_workers"])["scale_events"] == 0).all()

    if jobs["submit_s"].n_unique() > 1:  # usage is measured over the arrival window: NaN when it is empty
        assert 0.0 <= s["usage"] <= 1.0 + 1e-9
    assert s["preemptions"] == s["reclaim_preemptions"]  # only a reclaim preempts in this simulator
    assert s["reclaim_preemptions"] <= s["reclaims"] * case["infer_gpus"]  # one job per GPU of a returned server
    if ckpt == 0.0:
        assert s["lost_work_gpu_h"] == 0.0
    else:
        assert s["lost_work_gpu_h"] >= 0.0

    # loaning: the loan policies borrow exactly the idle inference servers; the others never borrow
    tl = r.timeline
    loaned = tl["loaned_servers"].to_numpy()
    idle = np.array([load.idle_at(t) for t in tl["time_s"].to_list()])
    train_cap = case["train_nodes"] * case["train_gpus"]
    if policy in ("aryl-base", "aryl-elastic"):
        assert s["loaned_gpu_hours"] == 0.0
        assert s["reclaims"] == 0
        assert (loaned == 0).all()
        assert tl["busy_gpus"].max() <= train_cap
    else:
        assert (loaned == idle).all()
        assert (tl["loaned_gpus_used"].to_numpy() <= loaned * case["infer_gpus"]).all()
        assert (tl["busy_gpus"].to_numpy() <= train_cap + loaned * case["infer_gpus"]).all()
        assert (
            tl["inference_gpus"].to_numpy() + loaned * case["infer_gpus"] == load.pool_servers * case["infer_gpus"]
        ).all()
    assert s["loaned_gpu_hours"] >= 0.0
    assert tl["running_jobs"].to_numpy()[-1] == 0 and tl["queued_jobs"].to_numpy()[-1] == 0
