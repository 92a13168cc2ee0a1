"""Masked PPO over a placement environment: progress bar, periodic checkpoints, resume from the newest one.

Deterministic for a seed (one torch thread, seeded PPO and episodes). PPO learns in whole rollouts, so the step
count rounds up to a multiple of ``n_steps``; a resumed run reseeds from the checkpoint's step count, so it is
deterministic too but not identical to an uninterrupted run. Checkpoints are read back as weights and optimizer
state only (``set_parameters``), never by unpickling the zip.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.placement.rl import require_rl

#: PPO settings: a small MLP, short rollouts, undiscounted (the return is minus the average JCT only with gamma 1).
PPO_SETTINGS: dict[str, Any] = {
    "n_steps": 1024,
    "batch_size": 128,
    "n_epochs": 5,
    "learning_rate": 3e-4,
    "gamma": 1.0,
    "gae_lambda": 0.95,
    "ent_coef": 0.01,
}


def checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """The ``rl_<steps>_steps.zip`` checkpoints in ``folder``, oldest first."""
    out = []
    for p in folder.glob("rl_*_steps.zip"):
        m = re.match(r"rl_(\d+)_steps\.zip$", p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def fit_placement(
    env: Any,
    out: str | Path,
    *,
    steps: int,
    seed: int = 0,
    checkpoint_every: int = 10_000,
    resume: bool = True,
    progress: bool = True,
    settings: dict[str, Any] | None = None,
    action_bias: dict[int, float] | None = None,
    title: str = "train placement",
) -> dict[str, Any]:
    """Train masked PPO on ``env`` for ``steps`` decisions in total and save the model to ``out`` (.zip).

    Checkpoints go to ``<out>.ckpt/`` every ``checkpoint_every`` steps; with ``resume`` the newest is loaded and
    training continues to ``steps``. ``action_bias`` adds to the initial logits of those actions (a fresh run only):
    a policy can start near a rule (e.g. waiting whenever allowed) and learn where to leave it. Returns a summary
    (steps, episodes, seconds, mean return of the last 20)."""
    require_rl()
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback

    if steps < 1 or checkpoint_every < 1:
        raise ConfigError("steps and checkpoint_every must be at least 1")
    torch.set_num_threads(1)
    out = Path(out).with_suffix(".zip")
    ckpt_dir = out.with_name(out.stem + ".ckpt")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ppo = {**PPO_SETTINGS, **(settings or {})}
    model = MaskablePPO(
        "MlpPolicy", env, seed=seed, device="cpu", verbose=0, policy_kwargs={"net_arch": [64, 64]}, **ppo
    )
    found = checkpoints(ckpt_dir) if resume else []
    done_steps = 0
    if found:
        done_steps, path = found[-1]
        model.set_parameters(str(path), exact_match=True, device="cpu")
        model.num_timesteps = done_steps
        model.set_random_seed(seed + done_steps)
    elif action_bias:
        with torch.no_grad():
            for action, value in action_bias.items():
                model.policy.action_net.bias[int(action)] += float(value)
    returns: list[float] = []

    class Progress(BaseCallback):
        """Rich progress bar, episode returns and periodic checkpoints."""

        def __init__(self) -> None:
            super().__init__()
            self._ret = 0.0
            self.bar: Any = None

        def _on_training_start(self) -> None:
            if progress:
                from rich.console import Console
                from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

                self.bar = Progress(
                    TextColumn(f"[bold]{title}[/]"),
                    BarColumn(),
                    TextColumn("{task.completed:,}/{task.total:,} steps"),
                    TextColumn("return {task.fields[ret]}"),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=Console(stderr=True),
                    transient=True,
                )
                self._task = self.bar.add_task("rl", total=steps, completed=done_steps, ret="-")
                self.bar.start()

        def _on_step(self) -> bool:
            self._ret += float(self.locals["rewards"][0])
            if self.locals["dones"][0]:
                returns.append(self._ret)
                self._ret = 0.0
            n = self.model.num_timesteps
            if n % checkpoint_every == 0:
                self.model.save(str(ckpt_dir / f"rl_{n}_steps.zip"))
            if self.bar is not None and n % 256 == 0:
                recent = returns[-20:]
                self.bar.update(self._task, completed=n, ret=f"{np.mean(recent):.2f}" if recent else "-")
            return True

    t0 = time.perf_counter()
    callback = Progress()
    try:
        if steps > done_steps:
            model.learn(total_timesteps=steps - done_steps, callback=callback, reset_num_timesteps=not found)
    finally:
        if callback.bar is not None:
            callback.bar.stop()
        env.close()  # never leave a simulator thread waiting for an action
    model.save(str(out))
    recent = returns[-20:]
    return {
        "model": str(out),
        "steps": int(model.num_timesteps),
        "resumed_from": done_steps,
        "episodes": len(returns),
        "train_s": time.perf_counter() - t0,
        "seed": seed,
        "mean_return_last20": float(np.mean(recent)) if recent else math.nan,
    }
