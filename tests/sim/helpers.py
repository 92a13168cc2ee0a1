"""Small builders shared by the simulator tests."""

from __future__ import annotations

import numpy as np
import polars as pl

from gpufleet.perf.contention import DEEPSHARE_MODELS, ContentionModel
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


def deepshare_arrivals(rng: np.random.Generator, n: int, hours: float) -> pl.DataFrame:
    """``n`` jobs of 2 to 16 GPUs with DeepShare models arriving over ``hours``, so that queues form and jobs
    spread over nodes (about 0.5 to 2 x each model's measured duration)."""
    model = ContentionModel.default()
    models = rng.choice(DEEPSHARE_MODELS, size=n)
    gpus = rng.choice([2, 4, 8, 16], size=n)
    return pl.DataFrame(
        {
            "job_id": [str(i) for i in range(n)],
            "submit_s": np.sort(rng.uniform(0, hours * 3600, size=n)),
            "duration_s": [
                model.duration_s(m, int(min(g, 8))) * rng.uniform(0.5, 2) for m, g in zip(models, gpus, strict=True)
            ],
            "num_gpus": gpus,
            "model": models,
        }
    )
