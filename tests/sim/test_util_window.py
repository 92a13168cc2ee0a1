"""``util_window``: GPU utilisation between the first and the last submission, on hand-computed runs."""

from __future__ import annotations

import polars as pl
import pytest
from helpers import jobs_frame

from gpufleet.sim.config import SimConfig
from gpufleet.sim.metrics import summarize, util_window
from gpufleet.sim.run import run_policies
from gpufleet.spec import ClusterSpec

#: 4 GPUs. FIFO: j0 (2 GPUs) runs 0-10; j1 (4 GPUs, submitted at 5) waits for it and runs 10-20; j2 (1 GPU)
#: is submitted last, at 20, and runs 20-25. Over the window [0, 20]: (2 x 10 + 4 x 10) / (4 x 20) = 0.75;
#: over the run [0, 25] (gpu_util): (20 + 40 + 5) / (4 x 25) = 0.65.
ROWS = [(0.0, 10.0, 2), (5.0, 10.0, 4), (20.0, 5.0, 1)]


@pytest.mark.parametrize("policy", ["fifo", "sjf", "tiresias"])
def test_util_window_of_a_tiny_run(policy: str) -> None:
    config = SimConfig(checkpoint_interval_s=0.0, restart_s=0.0, progress=False)
    (result,) = run_policies(jobs_frame(ROWS), ClusterSpec.single_pool(4, gpus_per_node=4), [policy], config)
    assert result.summary["util_window"] == pytest.approx(0.75)
    assert result.summary["gpu_util"] == pytest.approx(0.65)


def test_util_window_weights_time_and_ignores_what_lies_outside_the_window() -> None:
    jobs = jobs_frame([(10.0, 1.0, 1), (30.0, 1.0, 1)])
    # 6 busy from before the window to 20, 2 from 20 to 50 (past the last submit at 30): (6 x 10 + 2 x 10) / (8 x 20)
    timeline = pl.DataFrame({"time_s": [0.0, 20.0, 50.0], "busy_gpus": [6, 2, 0]})
    assert util_window(jobs, timeline, 8) == pytest.approx(0.5)
    assert util_window(jobs, timeline, 0) == 0.0
    assert util_window(jobs_frame([(5.0, 1.0, 1)]), timeline, 8) == 0.0  # one submission spans no time


def test_summarize_reports_util_window() -> None:
    jobs = jobs_frame(ROWS).with_columns(
        start_s=pl.Series([0.0, 10.0, 20.0]),
        finish_s=pl.Series([10.0, 20.0, 25.0]),
        jct_s=pl.Series([10.0, 15.0, 5.0]),
        queue_s=pl.Series([0.0, 5.0, 0.0]),
        preemptions=pl.Series([0, 0, 0]),
    )
    timeline = pl.DataFrame({"time_s": [0.0, 10.0, 20.0, 25.0], "busy_gpus": [2, 4, 1, 0]})
    row = summarize("fifo", jobs, timeline, 4, 0.1, {})
    assert row["util_window"] == pytest.approx(0.75) and row["gpu_util"] == pytest.approx(0.65)
