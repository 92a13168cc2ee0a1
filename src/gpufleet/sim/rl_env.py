"""The Gymnasium environment of the ``rl`` alias (the shipped t = 0 model): simulated job mixes, one step per
placement decision.

A thin builder over :mod:`gpufleet.sched.placement.rl_gym`, which owns the simulator <-> Gym hand-off: here are
the episodes (a cluster drawn from the given ones, jobs from the sampler, the network on), the alias policy and
the rewards. Between one decision and the next:
- ``jct`` (default): minus the job-time spent in the system in that interval (every arrived, unfinished job
  counts), in hours per job of the episode; an episode's return is then minus the average true JCT in hours
  (queueing included). Train it undiscounted (gamma 1): with discounting, a policy that waits more makes
  more decisions per hour and so discounts its own delays away.
- ``jct-tail``: ``jct`` plus, at the episode's end, minus half its p99 JCT in hours (the average alone lets
  a policy trade the largest jobs' completion for everyone else's).
- ``paper``: Ryu & Eo's ``-w1 * contention slowdown + w2 * utilisation``, where the slowdown is one minus the
  mean contention ratio of the running multi-node jobs.
The environment's ``last_result`` is the last finished episode's :class:`~gpufleet.sim.result.SimResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.placement.rl import Decider
from gpufleet.sched.placement.rl_gym import JctReward, make_placement_env
from gpufleet.sched.rl import LearnedPlacement, require_rl
from gpufleet.sched.rl_features import OBS_SIZE
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


class PaperReward:
    """Ryu & Eo's reward at each decision, ``-w1 * slowdown + w2 * utilisation``; nothing at the episode's end."""

    def __init__(self, w1: float, w2: float) -> None:
        self.w1, self.w2 = w1, w2

    def start(self, sim: Simulator) -> None:
        """Stateless: nothing to reset."""

    def step(self, sim: Simulator, now: float) -> float:
        net = sim.network
        if net is None:
            raise ConfigError("the paper reward reads the network model: train with the network on")
        ratios = [net.current_ratio(k) for k, links in net.links.items() if links]
        slowdown = 1.0 - (float(np.mean(ratios)) if ratios else 1.0)
        return -self.w1 * slowdown + self.w2 * sim.busy / sim.total_gpus

    def end(self, sim: Simulator, result: Any) -> float:
        return 0.0


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
    """The alias policy's ``PlacementEnv`` (built lazily so that gymnasium is imported only when asked for).

    ``cluster`` is one cluster spec or a list of them: each episode then runs on one drawn at random (a policy
    that must work on any cluster size learns from more than one)."""
    clusters = list(cluster) if isinstance(cluster, (list, tuple)) else [cluster]
    if not clusters:
        raise ConfigError("the RL environment needs at least one cluster")
    require_rl()
    if reward not in REWARDS:
        raise ConfigError(f"unknown reward '{reward}'; use one of {', '.join(REWARDS)}")

    def build(rng: np.random.Generator, decider: Decider) -> Simulator:
        spec = clusters[int(rng.integers(len(clusters)))] if len(clusters) > 1 else clusters[0]
        parts = partitions_for(spec)
        jobs = sampler(rng, sum(p.nodes for p in parts))
        net = network_for(spec, parts, jobs)
        policy = LearnedPlacement(decider=decider, order=order)
        return Simulator(Workload.from_frame(jobs), parts, policy, SimConfig(network=True), network=net)

    rewards = {"jct": JctReward(), "jct-tail": JctReward(TAIL_WEIGHT), "paper": PaperReward(w1, w2)}
    return make_placement_env(build, seed=seed, obs_size=OBS_SIZE, reward=rewards[reward])
