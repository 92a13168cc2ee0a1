"""The reclaim-notice schedule, per-job scaling curves from the perf model, and inference on base policies."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from gpufleet.sim.config import SimConfig
from gpufleet.sim.elastic_jobs import ElasticConfig
from gpufleet.sim.features.inference import held_schedule
from gpufleet.sim.run import RunSpec, run_one
from gpufleet.sim.scaling import PerfCurve, PowerLawCurve
from gpufleet.spec import ClusterSpec, Pool


def test_held_schedule_without_notice_is_the_load_merged():
    t, v = held_schedule(np.array([0.0, 10, 20, 30]), np.array([2, 2, 5, 1]), 0.0)
    assert t.tolist() == [0.0, 20.0, 30.0] and v.tolist() == [2, 5, 1]


def test_held_schedule_holds_servers_notice_seconds_ahead_and_loans_only_after():
    # inference needs 1, then 4 from t=100, then 0 from t=300; a 30 s notice
    t, v = held_schedule(np.array([0.0, 100, 300]), np.array([1, 4, 0]), 30.0)
    # at 70 the rise at 100 is within notice: hold 4 from 70; the fall at 300 frees servers at 300, not 270
    assert t.tolist() == [0.0, 70.0, 300.0] and v.tolist() == [1, 4, 0]


@pytest.mark.parametrize("notice", [0.0, 45.0, 600.0])
def test_held_schedule_never_below_the_need(notice):
    rng = np.random.default_rng(3)
    times = np.cumsum(rng.integers(1, 200, 50)).astype(float) - 1.0
    times[0] = 0.0
    need = rng.integers(0, 9, 50)
    t, v = held_schedule(times, need, notice)
    probe = np.linspace(0, times[-1] + 300, 2000)
    held = v[np.searchsorted(t, probe, side="right") - 1]
    needed = need[np.searchsorted(times, probe + notice, side="right") - 1]
    assert (held >= needed).all()


def test_a_job_naming_a_catalog_model_scales_by_the_perf_model():
    cluster = ClusterSpec(
        name="h", pools=(Pool(name="t", kind="training", gpu="h100", nodes=4, nic="ib-ndr", nics_per_node=8),)
    )
    jobs = pl.DataFrame(
        {
            "job_id": ["m", "p"],
            "submit_s": [0.0, 0.0],
            "duration_s": [36000.0, 36000.0],
            "num_gpus": [8, 8],
            "model": ["gpt3-1.3b", None],
            "min_workers": [1, 1],
            "max_workers": [2, 2],
        }
    )
    ecfg = ElasticConfig(scale_pause_s=40.0, interval_s=300.0)
    r = run_one(RunSpec("aryl-elastic", jobs, cluster, SimConfig(restart_s=0.0, debug=True), {}, elastic=ecfg))
    jct = dict(zip(r.jobs["job_id"], r.jobs["jct_s"], strict=True))
    curve = PerfCurve("gpt3-1.3b", "h100", 8, nic="ib-ndr")
    speed_m = curve.throughput(2) / curve.throughput(1)
    speed_p = PowerLawCurve().throughput(2)
    # both grow to 2 workers at the first round (300 s), pause 40 s, then run at their curve's speed
    assert jct["m"] == pytest.approx(340 + (36000 - 300) / speed_m, rel=1e-6)
    assert jct["p"] == pytest.approx(340 + (36000 - 300) / speed_p, rel=1e-6)
    assert speed_m != pytest.approx(speed_p, rel=1e-3)


def test_unknown_model_is_a_clear_error():
    from gpufleet.errors import GpufleetError

    cluster = ClusterSpec.single_pool(16, gpu="h100")
    jobs = pl.DataFrame(
        {"job_id": ["x"], "submit_s": [0.0], "duration_s": [10.0], "num_gpus": [8], "model": ["no-such-model"]}
    )
    with pytest.raises(GpufleetError, match="job x names model 'no-such-model'"):
        run_one(RunSpec("aryl", jobs, cluster, SimConfig(), {}))
