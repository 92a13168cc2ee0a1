"""Small builders for the elastic (Aryl) simulator tests: two-pool clusters, job frames, step loads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from gpufleet.sim.config import SimConfig
from gpufleet.sim.elastic_jobs import ElasticConfig
from gpufleet.sim.result import SimResult
from gpufleet.sim.run import RunSpec, run_one
from gpufleet.spec.cluster import ClusterSpec, Pool
from gpufleet.traces.inference import InferenceLoad

ARYL_POLICIES = ("aryl", "aryl-loan", "aryl-elastic", "aryl-base")

#: no checkpoint loss and no restart cost, invariants checked on every event
FREE = SimConfig(checkpoint_interval_s=0.0, restart_s=0.0, debug=True)

#: rounds every 300 s, a 40 s pause per rescale, loaned workers at half speed: easy numbers by hand
ECFG = ElasticConfig(scale_pause_s=40.0, interval_s=300.0, loan_speed=0.5)


def two_pool(
    train_nodes: int = 2,
    train_gpus: int = 8,
    infer_nodes: int = 2,
    infer_gpus: int = 8,
    train_gpu: str = "v100",
    infer_gpu: str = "t4",
) -> ClusterSpec:
    """A training pool of ``train_nodes`` x ``train_gpus`` and (if ``infer_nodes``) an inference pool.

    Server ids in the simulator follow pool order: training servers first, then inference servers.
    """
    pools = [Pool(name="train", kind="training", gpu=train_gpu, gpus_per_node=train_gpus, nodes=train_nodes)]
    if infer_nodes:
        pools.append(Pool(name="infer", kind="inference", gpu=infer_gpu, gpus_per_node=infer_gpus, nodes=infer_nodes))
    return ClusterSpec(name="tiny", pools=tuple(pools))


def job_frame(
    rows: Sequence[tuple[float, float, int]], workers: Sequence[tuple[int, int, int]] | None = None
) -> pl.DataFrame:
    """(submit_s, duration_s, num_gpus) rows -> job frame with ids j0, j1, ...

    ``workers``: one (min_workers, max_workers, gpus_per_worker) per row, written as trace columns.
    """
    data: dict[str, list] = {
        "job_id": [f"j{i}" for i in range(len(rows))],
        "submit_s": [float(r[0]) for r in rows],
        "duration_s": [float(r[1]) for r in rows],
        "num_gpus": [int(r[2]) for r in rows],
    }
    if workers is not None:
        data["min_workers"] = [int(w[0]) for w in workers]
        data["max_workers"] = [int(w[1]) for w in workers]
        data["gpus_per_worker"] = [int(w[2]) for w in workers]
    return pl.DataFrame(
        data,
        schema_overrides={"submit_s": pl.Float64, "duration_s": pl.Float64, "num_gpus": pl.Int64, "job_id": pl.Utf8},
    )


def step_load(times: Sequence[float], servers: Sequence[int], pool_servers: int = 2) -> InferenceLoad:
    """Servers the inference service needs: ``servers[i]`` from ``times[i]`` on (``times[0]`` is 0)."""
    return InferenceLoad(
        "step",
        time_s=np.array(times, dtype=np.float64),
        servers=np.array(servers, dtype=np.int64),
        pool_servers=pool_servers,
    )


def simulate(
    policy: str,
    jobs: pl.DataFrame,
    cluster: ClusterSpec,
    config: SimConfig = FREE,
    elastic: ElasticConfig | None = ECFG,
    inference: InferenceLoad | None = None,
    **opts: object,
) -> SimResult:
    """One run through ``run_one``, the way the CLI and the sweeps run it."""
    return run_one(RunSpec(policy, jobs, cluster, config, dict(opts), inference=inference, elastic=elastic))


def by_id(result: SimResult, column: str) -> list:
    """A column of the result's job frame in job-id order."""
    return result.jobs.sort("job_id")[column].to_list()
