"""A Gymnasium environment over any simulator: one step per decision the guarded ``rl`` placement asks for.

``sched`` never imports the simulator, so the caller hands in ``build(rng, decider)``: it draws an episode (jobs,
cluster, order), wires ``decider`` into an ``rl`` placement and returns the simulator, not yet run. The simulator
runs in a worker thread; each time the placement asks, the observation comes here and the thread blocks until
:meth:`step` brings the action back, so an episode is as deterministic as the simulator.

Reward between two decisions: minus the job-time spent in the system in that interval (every arrived, unfinished
job), in hours per job of the episode, so that an episode's return is minus its average JCT in hours (queueing
included); train it undiscounted. With ``tail_weight`` the episode's last step also takes off that weight times
its p99 JCT in hours (the average alone lets a policy trade the longest jobs' completion for everyone else's).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.placement.rl import Decider, require_rl
from gpufleet.sched.rl_features import ARRIVAL_OBS_SIZE, N_ACTIONS

#: Draws one episode: a simulator (``run()``, ``submit``, ``finish``, ``now``, ``n``) whose ``rl`` placement asks
#: the given decider.
EpisodeBuilder = Callable[[np.random.Generator, Decider], Any]


class _Abort(Exception):
    """Raised inside the simulator thread to end an episode early."""


def make_placement_env(
    build: EpisodeBuilder, *, seed: int = 0, obs_size: int = ARRIVAL_OBS_SIZE, tail_weight: float = 0.0
) -> Any:
    """A ``PlacementEnv`` over the episodes ``build`` draws (gymnasium is imported only here)."""
    require_rl()
    import gymnasium as gym

    class PlacementEnv(gym.Env):
        """The decisions of an ``rl`` placement over simulated episodes, with the JCT reward."""

        metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

        def __init__(self) -> None:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_size,), dtype=np.float32)
            self.action_space = gym.spaces.Discrete(N_ACTIONS)
            self._rng = np.random.default_rng(seed)
            self._thread: threading.Thread | None = None
            self._to_env: queue.Queue = queue.Queue(maxsize=1)
            self._to_sim: queue.Queue = queue.Queue(maxsize=1)
            self.sim: Any = None
            self.episodes = 0
            self.last_summary: dict[str, Any] = {}
            self._mask = np.ones(N_ACTIONS, dtype=bool)

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

        def _reward(self, now: float) -> float:
            finish = np.asarray(self.sim.finish, dtype=np.float64)
            arrived = self._submit <= now
            end = np.where(np.isnan(finish), now, np.minimum(finish, now))
            acc = float(np.sum((end - self._submit)[arrived]))
            r = -(acc - self._acc) / (3600.0 * self._scale)
            self._acc = acc
            return r

        def _next(self) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
            kind, a, b = self._to_env.get()
            if kind == "error":
                raise a
            if kind == "done":
                self._thread = None
                self.last_summary = dict(getattr(a, "summary", {}) or {})
                finish = np.asarray(self.sim.finish, dtype=np.float64)
                end = float(np.nanmax(finish)) if finish.size and not np.isnan(finish).all() else 0.0
                r = self._reward(end)
                if tail_weight > 0 and finish.size:
                    r -= tail_weight * float(np.nanpercentile(finish - self._submit, 99)) / 3600.0
                return np.zeros(obs_size, dtype=np.float32), r, True, {"summary": self.last_summary}
            self._mask = b
            return a, self._reward(float(self.sim.now)), False, {"action_mask": b}

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            super().reset(seed=seed)
            if seed is not None:
                self._rng = np.random.default_rng(seed)
            self._stop()
            for _ in range(100):
                self.sim = build(self._rng, self._decide)
                self._submit = np.asarray(self.sim.submit, dtype=np.float64)
                self._scale = float(max(self.sim.n, 1))
                self._acc = 0.0
                self.episodes += 1
                self._thread = threading.Thread(target=self._run, args=(self.sim,), daemon=True)
                self._thread.start()
                obs, _, done, info = self._next()
                if not done:  # an episode that asked nothing teaches nothing: draw another
                    return obs, info
            raise ConfigError("100 episodes in a row asked the placement nothing: do the episodes queue?")

        def step(self, action: int):
            self._to_sim.put(int(action))
            obs, r, done, info = self._next()
            return obs, r, done, False, info

        def action_masks(self) -> np.ndarray:
            """Feasible actions of the pending decision (for maskable algorithms and tests)."""
            return self._mask

        def close(self) -> None:
            self._stop()

    return PlacementEnv()
