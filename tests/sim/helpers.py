"""Small builders shared by the simulator tests."""

from __future__ import annotations

import polars as pl

from gpufleet.sched.policy import make_policy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.partition import Partition
from gpufleet.sim.result import SimResult
from gpufleet.sim.workload import Workload

#: no checkpoint loss and no restart cost: the setting where hand-computed JCTs are easy to check
FREE_PREEMPTION = SimConfig(checkpoint_interval_s=0.0, restart_s=0.0, debug=True)


def jobs_frame(rows: list[tuple[float, float, int]]) -> pl.DataFrame:
    """(submit_s, duration_s, num_gpus) rows -> canonical job frame with ids j0, j1, ..."""
    return pl.DataFrame(
        {
            "job_id": [f"j{i}" for i in range(len(rows))],
            "submit_s": [float(r[0]) for r in rows],
            "duration_s": [float(r[1]) for r in rows],
            "num_gpus": [int(r[2]) for r in rows],
        }
    )


def simulate(
    rows, policy: str, nodes: int = 1, gpus_per_node: int = 2, config: SimConfig = FREE_PREEMPTION, **opts
) -> SimResult:
    sim = Simulator(
        Workload.from_frame(jobs_frame(rows)),
        [Partition("p", "v100", nodes, gpus_per_node)],
        make_policy(policy, **opts),
        config,
    )
    return sim.run()


def finish_times(result: SimResult) -> list[float]:
    return result.jobs.sort("job_id")["finish_s"].to_list()
