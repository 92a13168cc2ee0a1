"""Settings of one simulation run that do not belong to the policy: placement, preemption costs, debug."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.errors import ConfigError

PLACEMENTS = ("consolidate", "spread")


@dataclass(frozen=True)
class SimConfig:
    """How the simulated cluster places and restarts jobs.

    ``placement_penalty`` is the throughput a job loses when it spans more nodes than it needs (a trace's
    duration is taken as the run time on the fewest nodes). ``checkpoint_interval_s`` is the progress between
    two checkpoints: a preempted job resumes from its last one (0 = it checkpoints when preempted and loses
    nothing). ``restart_s`` is the time a resumed job spends restoring before it progresses again.
    """

    placement: str = "consolidate"
    strict_placement: bool = False
    placement_penalty: float = 0.2
    checkpoint_interval_s: float = 0.0
    restart_s: float = 60.0
    debug: bool = False
    progress: bool = False
    #: model network contention between multi-node jobs (gpufleet.sim.network); speeds then replace the penalty
    network: bool = False

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"unknown placement '{self.placement}'; use one of {', '.join(PLACEMENTS)}")
        if not 0.0 <= self.placement_penalty < 1.0:
            raise ConfigError(f"placement_penalty must be in [0, 1), got {self.placement_penalty}")
        if self.checkpoint_interval_s < 0 or self.restart_s < 0:
            raise ConfigError("checkpoint_interval_s and restart_s must be >= 0")
