"""A Gymnasium environment over the simulator: one step per placement decision of the ``rl`` policy.

The simulator runs in a worker thread; when the ``rl`` policy must place a job it hands the observation to
the environment and blocks until :meth:`ContentionEnv.step` brings the action back. The hand-off is
synchronous, so an episode is exactly as deterministic as the simulator (same seed, same episode).

Rewards, between one decision and the next:
- ``jct`` (default): minus the job-time spent in the system in that interval (every arrived, unfinished job
  counts), in hours per job of the episode; an episode's return is then minus the average true JCT in hours
  (queueing included). Train it undiscounted (gamma 1): with discounting, a policy that waits more makes
  more decisions per hour and so discounts its own delays away.
- ``jct-tail``: ``jct`` plus, at the episode's end, minus half its p99 JCT in hours (the average alone lets
  a policy trade the largest jobs' completion for everyone else's).
- ``paper``: Ryu & Eo's ``-w1 * contention slowdown + w2 * utilisation``, where the slowdown is one minus the
  mean contention ratio of the running multi-node jobs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.rl import LearnedPlacement, require_rl
from gpufleet.sched.rl_features import N_ACTIONS, OBS_SIZE
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.network import network_for
from gpufleet.sim.workload import Workload, partitions_for

REWARDS = ("jct", "jct-tail", "paper")
#: Weight of the episode's p99 JCT (hours) in the ``jct-tail`` reward's last step.
TAIL_WEIGHT = 0.5
#: Draws an episode's jobs (a canonical frame with a ``model`` column) from a seeded generator, for a cluster of
#: the given number of training nodes.
EpisodeSampler = Callable[[np.random.Generator, int], Any]


class _Abort(Exception):
    """Raised inside the simulator thread to end an episode early."""


def make_env(
    cluster: Any,
    sampler: EpisodeSampler,
    *,
    reward: str = "jct",
    w1: float = 0.5,
    w2: float = 0.5,
    seed: int = 0,
    order: str = "srtf",
) -> Any:
    """A :class:`ContentionEnv` (built lazily so that gymnasium is imported only when asked for).

    ``cluster`` is one cluster spec or a list of them: each episode then runs on one drawn at random (a policy
    that must work on any cluster size learns from more than one)."""
    clusters = list(cluster) if isinstance(cluster, (list, tuple)) else [cluster]
    if not clusters:
        raise ConfigError("the RL environment needs at least one cluster")
    require_rl()
    import gymnasium as gym

    if reward not in REWARDS:
        raise ConfigError(f"unknown reward '{reward}'; use one of {', '.join(REWARDS)}")

    class ContentionEnv(gym.Env):
        """Placement decisions of the ``rl`` policy over simulated job mixes on ``cluster``."""

        metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

        def __init__(self) -> None:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (OBS_SIZE,), dtype=np.float32)
            self.action_space = gym.spaces.Discrete(N_ACTIONS)
            self._rng = np.random.default_rng(seed)
            self._thread: threading.Thread | None = None
            self._to_env: queue.Queue = queue.Queue(maxsize=1)
            self._to_sim: queue.Queue = queue.Queue(maxsize=1)
            self.sim: Simulator | None = None
            self.episodes = 0
            self.last_result: Any = None

        # -- the simulator side ------------------------------------------------------------------
        def _decide(self, obs: np.ndarray, mask: np.ndarray) -> int:
            self._to_env.put(("decide", obs, mask))
            action = self._to_sim.get()
            if action is None:
                raise _Abort
            return int(action)

        def _run(self, sim: Simulator) -> None:
            try:
                result = sim.run()
                self._to_env.put(("done", result, None))
            except _Abort:
                pass
            except BaseException as exc:  # surface simulator errors in the trainer's thread
                self._to_env.put(("error", exc, None))

        def _stop(self) -> None:
            if self._thread is not None and self._thread.is_alive():
                self._to_sim.put(None)
                self._thread.join()
            self._thread = None
            while not self._to_env.empty():
                self._to_env.get_nowait()
            while not self._to_sim.empty():
                self._to_sim.get_nowait()

        # -- rewards -----------------------------------------------------------------------------
        def _bound(self) -> Simulator:
            """The running episode's simulator (set by ``reset`` before any step or reward)."""
            if self.sim is None:
                raise RuntimeError("the environment has no episode: call reset() first")
            return self.sim

        def _system_time(self, now: float) -> float:
            sim = self._bound()
            submit = self._submit
            arrived = submit <= now
            finish = np.asarray(sim.finish)
            end = np.where(np.isnan(finish), now, np.minimum(finish, now))
            return float(np.sum((end - submit)[arrived]))

        def _paper_reward(self) -> float:
            sim = self._bound()
            net = sim.network
            if net is None:
                raise ConfigError("the paper reward reads the network model: train with the network on")
            ratios = [net.current_ratio(k) for k, links in net.links.items() if links]
            slowdown = 1.0 - (float(np.mean(ratios)) if ratios else 1.0)
            return -w1 * slowdown + w2 * sim.busy / sim.total_gpus

        def _reward(self, now: float) -> float:
            if reward == "paper":
                return self._paper_reward()
            acc = self._system_time(now)
            r = -(acc - self._acc) / (3600.0 * self._scale)  # hours per job
            self._acc = acc
            return r

        # -- the gym API -------------------------------------------------------------------------
        def _next(self) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
            kind, a, b = self._to_env.get()
            if kind == "error":
                raise a
            if kind == "done":
                self.last_result = a
                self._thread = None
                sim = self._bound()
                end = float(np.nanmax(np.asarray(sim.finish))) if sim.n else 0.0
                r = self._reward(end) if reward != "paper" else 0.0
                if reward == "jct-tail" and a.jobs.height:
                    r -= TAIL_WEIGHT * float(np.percentile(a.jobs["jct_s"].to_numpy(), 99)) / 3600.0
                return np.zeros(OBS_SIZE, dtype=np.float32), r, True, {"summary": a.summary}
            self._mask = b
            return a, self._reward(self._bound().now), False, {"action_mask": b}

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            super().reset(seed=seed)
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            self._stop()
            for _ in range(100):
                spec = clusters[int(self._rng.integers(len(clusters)))] if len(clusters) > 1 else clusters[0]
                parts = partitions_for(spec)
                jobs = sampler(self._rng, sum(p.nodes for p in parts))
                net = network_for(spec, parts, jobs)
                policy = LearnedPlacement(decider=self._decide, order=order)
                self.sim = Simulator(Workload.from_frame(jobs), parts, policy, SimConfig(network=True), network=net)
                self._submit = np.asarray(self.sim.submit)
                self._scale = float(max(self.sim.n, 1))
                self._acc = 0.0
                self.episodes += 1
                self._thread = threading.Thread(target=self._run, args=(self.sim,), daemon=True)
                self._thread.start()
                obs, _, done, info = self._next()
                if not done:  # an episode without a single decision teaches nothing: draw another
                    return obs, info
            raise ConfigError(
                "100 episodes in a row needed no placement decision: do the jobs fit the cluster, "
                "and does each episode have jobs?"
            )

        def step(self, action: int):
            self._to_sim.put(int(action))
            obs, r, done, info = self._next()
            return obs, r, done, False, info

        def action_masks(self) -> np.ndarray:
            """Feasible actions of the pending decision (for maskable algorithms and tests)."""
            return self._mask

        def close(self) -> None:
            self._stop()

    return ContentionEnv()
