"""Train the ``rl`` placement policy with PPO, and evaluate it beside the baselines on unseen mixes.

Training draws each episode from DeepShare-style mixes (or windows of a user's trace) with seeds from
:data:`TRAIN_SEED_BASE` up; evaluation uses seeds below it, so no evaluated mix was ever trained on.
Training is deterministic for a seed (one torch thread, seeded PPO and episode sampler), shows a progress
bar, writes a checkpoint every ``checkpoint_every`` steps and resumes from the newest one. PPO learns in whole
rollouts, so the step count rounds up to a multiple of 1,024; a resumed run reseeds its sampler from the
checkpoint's step count, so it is deterministic too but not identical to an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gpufleet.errors import ConfigError
from gpufleet.sched.rl import require_rl

#: Episode seeds for training start here; evaluation seeds (0, 1, 2, ...) stay below.
TRAIN_SEED_BASE = 1_000_000
#: Mixes training draws from, in turn.
TRAIN_MIXES = ("heavy", "random", "medium", "light")


@dataclass(frozen=True)
class MixSampler:
    """Episodes from DeepShare-style mixes: a mix name and a fresh seed per episode; batch or Poisson arrival."""

    mixes: Sequence[str] = TRAIN_MIXES
    jobs: int = 128  # per 4 nodes, on average: each episode draws 0.5x, 1x or 2x this many
    gpus_per_node: int = 8
    poisson_share: float = 0.5

    def __call__(self, rng: np.random.Generator, nodes: int = 4) -> pl.DataFrame:
        from gpufleet.sim.mixes import generate_mix

        mix = self.mixes[int(rng.integers(len(self.mixes)))]
        seed = TRAIN_SEED_BASE + int(rng.integers(1 << 30))
        arrival = "poisson" if rng.random() < self.poisson_share else "batch"
        jobs = max(2, int(self.jobs * max(nodes, 1) / 4 * (0.5, 1.0, 2.0)[int(rng.integers(3))]))
        return generate_mix(mix, jobs=jobs, seed=seed, arrival=arrival, gpus_per_node=self.gpus_per_node)


@dataclass(frozen=True)
class TraceSampler:
    """Episodes from a user's trace: a random window of ``jobs`` consecutive jobs, submit times from 0."""

    trace: pl.DataFrame
    jobs: int = 128

    def __call__(self, rng: np.random.Generator, nodes: int = 4) -> pl.DataFrame:
        n = self.trace.height
        size = min(self.jobs, n)
        start = int(rng.integers(0, n - size + 1))
        window = self.trace.slice(start, size)
        return window.with_columns(pl.col("submit_s") - pl.col("submit_s").min())


def train_rl(
    cluster: Any,
    out: str | Path,
    *,
    steps: int = 100_000,
    seed: int = 0,
    sampler: Callable[[np.random.Generator], pl.DataFrame] | None = None,
    reward: str = "jct",
    order: str = "srtf",
    checkpoint_every: int = 10_000,
    resume: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Train PPO on ``cluster`` (one spec or a list, one drawn per episode) for ``steps`` decisions and save the
    model to ``out`` (a .zip).

    Checkpoints go to ``<out>.ckpt/``; with ``resume`` the newest one is loaded and training continues to
    ``steps`` in total. Returns a summary (steps, episodes, seconds, mean episode return of the last 20).
    """
    require_rl()
    from gpufleet.sched.placement.rl_fit import fit_placement
    from gpufleet.sim.rl_env import make_env

    if steps < 1:
        raise ConfigError("--steps must be at least 1")
    if checkpoint_every < 1:
        raise ConfigError("--checkpoint-every must be at least 1")
    env = make_env(cluster, sampler or MixSampler(), reward=reward, seed=seed, order=order)
    # masked PPO (infeasible candidates are never sampled, so no action becomes a stand-in for another: with plain
    # PPO an always-infeasible slot on 4 nodes was learned as "ask the heuristic", and on 64 nodes, where it fits,
    # it spread jobs over 8 nodes), with the trainer every placement model uses
    summary = fit_placement(
        env,
        out,
        steps=steps,
        seed=seed,
        checkpoint_every=checkpoint_every,
        resume=resume,
        progress=progress,
        title="train-rl",
    )
    return {**summary, "reward": reward, "order": order}


def eval_policies(
    cluster: Any,
    policies: Sequence[str],
    *,
    mix: str = "heavy",
    seeds: Sequence[int] = range(5),
    jobs: int = 256,
    arrival: str = "batch",
    policy_opts: dict[str, dict[str, Any]] | None = None,
    gpus_per_node: int = 8,
) -> pl.DataFrame:
    """Each policy on the same unseen mixes (seeds below :data:`TRAIN_SEED_BASE`): one row per policy and seed.

    A run that leaves jobs unfinished is an error: its JCT figures would cover only the jobs that finished, and a
    policy that stalls the cluster would look faster than one that does not."""
    from gpufleet.sim.config import SimConfig
    from gpufleet.sim.mixes import generate_mix
    from gpufleet.sim.run import RunSpec, run_one

    bad = [s for s in seeds if s >= TRAIN_SEED_BASE]
    if bad:
        raise ConfigError(f"evaluation seeds must be below {TRAIN_SEED_BASE} (training uses those): {bad[:3]}")
    rows = []
    for seed in seeds:
        frame = generate_mix(mix, jobs=jobs, seed=int(seed), arrival=arrival, gpus_per_node=gpus_per_node)
        for name in policies:
            r = run_one(RunSpec(name, frame, cluster, SimConfig(network=True), dict((policy_opts or {}).get(name, {}))))
            s = r.summary
            if s["finished"] < s["jobs"]:
                raise ConfigError(
                    f"policy {name} finished only {s['finished']} of {s['jobs']} jobs on mix seed "
                    f"{seed}: it stalled the cluster, so its JCT would cover only the finished jobs"
                )
            rows.append(
                {
                    "policy": name,
                    "seed": int(seed),
                    "avg_jct_s": s["avg_jct_s"],
                    "p99_jct_s": s["p99_jct_s"],
                    "makespan_s": s["makespan_s"],
                    "gpu_util": s["gpu_util"],
                    "contention_gpu_h": s.get("contention_gpu_h", 0.0),
                    "multi_node_share": s.get("multi_node_share", 0.0),
                    "wall_s": s["wall_s"],
                }
            )
    return pl.DataFrame(rows)


def summarize_eval(frame: pl.DataFrame) -> pl.DataFrame:
    """Per policy: means over seeds."""
    return frame.group_by("policy", maintain_order=True).agg(
        pl.col(
            "avg_jct_s", "p99_jct_s", "makespan_s", "gpu_util", "contention_gpu_h", "multi_node_share", "wall_s"
        ).mean(),
        pl.len().alias("seeds"),
    )


#: The heuristic baselines ``rl`` is judged against: the best of them by average JCT.
BASELINE_POLICIES = ("las", "srtf", "tiresias")


def best_baseline(means: pl.DataFrame) -> str | None:
    """The policy of :data:`BASELINE_POLICIES` with the lowest mean average JCT in :func:`summarize_eval`'s frame."""
    base = means.filter(means["policy"].is_in(list(BASELINE_POLICIES)))
    if base.height == 0:
        return None
    return str(base.sort("avg_jct_s")["policy"][0])


def sized_clusters(spec: Any, factors: Sequence[int]) -> list[Any]:
    """``spec`` scaled to each factor of its training GPUs (1: itself), for training on more than one size."""
    from gpufleet.sim.workload import partitions_for

    if not factors or min(factors) < 1:
        raise ConfigError("--sizes needs factors of at least 1")
    total = sum(p.total for p in partitions_for(spec))
    return [spec if f == 1 else spec.resized(total * f) for f in factors]
