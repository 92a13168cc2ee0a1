"""A Gymnasium environment over any simulator: one step per decision an ``rl`` placement asks for.

The one simulator <-> Gym hand-off of the project: the arrival training here and the shipped t = 0 model's
environment (``gpufleet.sim.rl_env``) both build on it. ``sched`` never imports the simulator, so the caller hands
in ``build(rng, decider)``: it draws an episode (jobs, cluster, order), wires ``decider`` into an ``rl`` placement
and returns the simulator, not yet run. The simulator runs in a worker thread; each time the placement asks, the
observation comes here and the thread blocks until :meth:`step` brings the action back, so an episode is as
deterministic as the simulator. The episode ends when the simulation does.

Default reward (:class:`JctReward`), between two decisions: minus the job-time spent in the system in that interval
(every arrived, unfinished job), in hours per job of the episode, so that an episode's return is minus its average
JCT in hours (queueing included); train it undiscounted. With ``tail_weight`` the episode's last step also takes
off that weight times its p99 JCT in hours (the average alone lets a policy trade the longest jobs' completion for
everyone else's). A caller may pass any other :class:`EpisodeReward`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.placement.rl import Decider, require_rl
from gpufleet.sched.rl_features import ARRIVAL_OBS_SIZE, N_ACTIONS

#: Draws one episode: a simulator (``run()``, ``submit``, ``finish``, ``now``, ``n``) whose ``rl`` placement asks
#: the given decider.
EpisodeBuilder = Callable[[np.random.Generator, Decider], Any]


class EpisodeReward(Protocol):
    """The reward of an episode: told when it starts, asked at each decision and once when the simulation ends."""

    def start(self, sim: Any) -> None:
        """A new episode on ``sim`` (not yet run)."""

    def step(self, sim: Any, now: float) -> float:
        """The reward for the interval since the last decision, up to ``now``."""

    def end(self, sim: Any, result: Any) -> float:
        """The reward of the episode's last step; ``result`` is what ``sim.run()`` returned."""


class JctReward:
    """Minus the job-hours in the system per job of the episode (return = minus the average JCT in hours), and at
    the end minus ``tail_weight`` times the episode's p99 JCT in hours."""

    def __init__(self, tail_weight: float = 0.0) -> None:
        self.tail_weight = tail_weight
        self.acc = 0.0  # job-seconds spent in the system up to the last decision
        self._submit = np.zeros(0)
        self._scale = 1.0

    def start(self, sim: Any) -> None:
        self._submit = np.asarray(sim.submit, dtype=np.float64)
        self._scale = float(max(sim.n, 1))
        self.acc = 0.0

    def step(self, sim: Any, now: float) -> float:
        finish = np.asarray(sim.finish, dtype=np.float64)
        arrived = self._submit <= now
        end = np.where(np.isnan(finish), now, np.minimum(finish, now))
        acc = float(np.sum((end - self._submit)[arrived]))
        r = -(acc - self.acc) / (3600.0 * self._scale)
        self.acc = acc
        return r

    def end(self, sim: Any, result: Any) -> float:
        finish = np.asarray(sim.finish, dtype=np.float64)
        last = float(np.nanmax(finish)) if finish.size and not np.isnan(finish).all() else 0.0
        r = self.step(sim, last)
        if self.tail_weight > 0 and finish.size:
            r -= self.tail_weight * float(np.nanpercentile(finish - self._submit, 99)) / 3600.0
        return r


class _Abort(Exception):
    """Raised inside the simulator thread to end an episode early."""


def make_placement_env(
    build: EpisodeBuilder,
    *,
    seed: int = 0,
    obs_size: int = ARRIVAL_OBS_SIZE,
    tail_weight: float = 0.0,
    reward: EpisodeReward | None = None,
) -> Any:
    """A ``PlacementEnv`` over the episodes ``build`` draws (gymnasium is imported only here).

    ``reward`` replaces the default :class:`JctReward` (``tail_weight`` applies to the default only)."""
    require_rl()
    import gymnasium as gym

    class PlacementEnv(gym.Env):
        """The decisions of an ``rl`` placement over simulated episodes."""

        metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

        def __init__(self) -> None:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_size,), dtype=np.float32)
            self.action_space = gym.spaces.Discrete(N_ACTIONS)
            self.reward: EpisodeReward = reward if reward is not None else JctReward(tail_weight)
            self._rng = np.random.default_rng(seed)
            self._thread: threading.Thread | None = None
            self._to_env: queue.Queue = queue.Queue(maxsize=1)
            self._to_sim: queue.Queue = queue.Queue(maxsize=1)
            self.sim: Any = None
            self.episodes = 0
            self.last_result: Any = None  # what the last finished episode's ``sim.run()`` returned
            self.last_summary: dict[str, Any] = {}
            self._mask = np.ones(N_ACTIONS, dtype=bool)

        # -- the simulator's thread ----------------------------------------------------------------
        def _decide(self, obs: np.ndarray, mask: np.ndarray) -> int:
            self._to_env.put(("decide", obs, mask))
            action = self._to_sim.get()
            if action is None:
                raise _Abort
            return int(action)

        def _run(self, sim: Any) -> None:
            try:
                self._to_env.put(("done", sim.run(), None))
            except _Abort:
                pass
            except BaseException as exc:  # surface simulator errors in the trainer's thread
                self._to_env.put(("error", exc, None))

        def _stop(self) -> None:
            if self._thread is not None and self._thread.is_alive():
                self._to_sim.put(None)
                self._thread.join()
            self._thread = None
            for q in (self._to_env, self._to_sim):
                while not q.empty():
                    q.get_nowait()

        # -- the gym API ---------------------------------------------------------------------------
        def _next(self) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
            kind, a, b = self._to_env.get()
            if kind == "error":
                raise a
            if kind == "done":
                self._thread = None
                self.last_result = a
                self.last_summary = dict(getattr(a, "summary", {}) or {})
                r = self.reward.end(self.sim, a)
                return np.zeros(obs_size, dtype=np.float32), r, True, {"summary": self.last_summary}
            self._mask = b
            return a, self.reward.step(self.sim, float(self.sim.now)), False, {"action_mask": b}

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            super().reset(seed=seed)
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            self._stop()
            for _ in range(100):
                self.sim = build(self._rng, self._decide)
                self.reward.start(self.sim)
                self.episodes += 1
                self._thread = threading.Thread(target=self._run, args=(self.sim,), daemon=True)
                self._thread.start()
                obs, _, done, info = self._next()
                if not done:  # an episode that asked nothing teaches nothing: draw another
                    return obs, info
            raise ConfigError(
                "100 episodes in a row asked the placement nothing: do the jobs fit the cluster, "
                "does each episode have jobs, and do they queue?"
            )

        def step(self, action: int):
            if self._thread is None:
                raise RuntimeError("the environment has no running episode: call reset() first")
            self._to_sim.put(int(action))
            obs, r, done, info = self._next()
            return obs, r, done, False, info

        def action_masks(self) -> np.ndarray:
            """Feasible actions of the pending decision (for maskable algorithms and tests)."""
            return self._mask

        def close(self) -> None:
            self._stop()

    return PlacementEnv()
