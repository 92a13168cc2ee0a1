"""Train the ``rl`` placement policy with PPO, and evaluate it beside the baselines on unseen mixes.

Training draws each episode from DeepShare-style mixes (or windows of a user's trace) with seeds from
:data:`TRAIN_SEED_BASE` up; evaluation uses seeds below it, so no evaluated mix was ever trained on.
Training is deterministic for a seed (one torch thread, seeded PPO and episode sampler), shows a progress
bar, writes a checkpoint every ``checkpoint_every`` steps and resumes from the newest one. PPO learns in whole
rollouts, so the step count rounds up to a multiple of 1,024; a resumed run reseeds its sampler from the
checkpoint's step count, so it is deterministic too but not identical to an uninterrupted run.
"""

from __future__ import annotations

import math
import re
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
#: PPO settings (small MLP, as the paper's; a shorter rollout than SB3's default suits short episodes). Undiscounted:
#: the JCT reward's return is minus the average JCT only with gamma = 1 (see gpufleet.sim.rl_env).
PPO_SETTINGS: dict[str, Any] = {
    "n_steps": 1024,
    "batch_size": 128,
    "n_epochs": 5,
    "learning_rate": 3e-4,
    "gamma": 1.0,
    "gae_lambda": 0.95,
    "ent_coef": 0.01,
}


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


def _checkpoints(folder: Path) -> list[tuple[int, Path]]:
    out = []
    for p in folder.glob("rl_*_steps.zip"):
        m = re.match(r"rl_(\d+)_steps\.zip$", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


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
    import time

    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback

    from gpufleet.sim.rl_env import make_env

    if steps < 1:
        raise ConfigError("--steps must be at least 1")
    if checkpoint_every < 1:
        raise ConfigError("--checkpoint-every must be at least 1")
    torch.set_num_threads(1)
    out = Path(out)
    if out.suffix != ".zip":
        out = out.with_suffix(".zip")
    ckpt_dir = out.with_name(out.stem + ".ckpt")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    env = make_env(cluster, sampler or MixSampler(), reward=reward, seed=seed, order=order)
    done_steps = 0
    found = _checkpoints(ckpt_dir) if resume else []
    # masked PPO: infeasible candidates are never sampled, so no action becomes a stand-in for another
    # (with plain PPO an always-infeasible slot on 4 nodes was learned as "ask the heuristic", and on 64
    # nodes, where it fits, it spread jobs over 8 nodes)
    model = MaskablePPO(
        "MlpPolicy", env, seed=seed, device="cpu", verbose=0, policy_kwargs={"net_arch": [64, 64]}, **PPO_SETTINGS
    )
    if found:
        # a checkpoint's weights and optimizer state only (torch.load with weights_only): MaskablePPO.load would
        # also unpickle the zip's other entries, which can run code; the settings above are the same anyway
        done_steps, path = found[-1]
        model.set_parameters(str(path), exact_match=True, device="cpu")
        model.num_timesteps = done_steps
        model.set_random_seed(seed + done_steps)
    returns: list[float] = []

    class Progress(BaseCallback):
        """Rich progress bar, episode returns and periodic checkpoints."""

        def __init__(self) -> None:
            super().__init__()
            self._ret = 0.0
            self._bar: Any = None

        def _on_training_start(self) -> None:
            if progress:
                from rich.console import Console
                from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

                self._bar = Progress(
                    TextColumn("[bold]train-rl[/]"),
                    BarColumn(),
                    TextColumn("{task.completed:,}/{task.total:,} steps"),
                    TextColumn("return {task.fields[ret]}"),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=Console(stderr=True),
                    transient=True,
                )
                self._task = self._bar.add_task("rl", total=steps, completed=done_steps, ret="-")
                self._bar.start()

        def _on_step(self) -> bool:
            self._ret += float(self.locals["rewards"][0])
            if self.locals["dones"][0]:
                returns.append(self._ret)
                self._ret = 0.0
            n = self.model.num_timesteps
            if n % checkpoint_every == 0:
                self.model.save(str(ckpt_dir / f"rl_{n}_steps.zip"))
            if self._bar is not None and n % 256 == 0:
                recent = returns[-20:]
                self._bar.update(self._task, completed=n, ret=f"{np.mean(recent):.1f}" if recent else "-")
            return True

        def _on_training_end(self) -> None:
            if self._bar is not None:
                self._bar.stop()

    t0 = time.perf_counter()
    left = steps - done_steps
    callback = Progress()
    try:
        if left > 0:
            model.learn(total_timesteps=left, callback=callback, reset_num_timesteps=not found, progress_bar=False)
    finally:
        if callback._bar is not None:
            callback._bar.stop()
        env.close()  # never leave a simulator thread waiting for an action
    wall = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    recent = returns[-20:]
    return {
        "model": str(out),
        "steps": int(model.num_timesteps),
        "resumed_from": done_steps,
        "episodes": len(returns),
        "train_s": wall,
        "seed": seed,
        "reward": reward,
        "order": order,
        "mean_return_last20": float(np.mean(recent)) if recent else math.nan,
    }


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
