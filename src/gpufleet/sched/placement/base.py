"""The placement interface: which GPUs a job gets once its order lets it start, behind a registry.

Scheduling is three layers (docs/simulator.md): the *order* (a :class:`~gpufleet.sched.policy.Policy`: which
job goes first, and whether running jobs are preempted), the *placement* (this module: on which nodes it
runs, or whether it waits for a better slot) and *capacity* (Aryl's loaning and elastic scaling). Any order
runs with any placement: ``gpufleet simulate --policy srtf --placement rl``.

A placement is one file in :mod:`gpufleet.sched.placement`: subclass :class:`Placement`, set ``name`` and
``summary``, decorate with :func:`register`. :meth:`Placement.place` returns the GPUs it took from the
partition, or None; None with :attr:`Placement.waited` set means the placement *chose* to hold the job for a
better slot (the simulator then does not preempt for it). While :attr:`Placement.may_wait` is False (the
simulator has just preempted jobs to make room) a placement must not wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from gpufleet.errors import ConfigError
from gpufleet.registry import Registry

if TYPE_CHECKING:
    from gpufleet.sched.view import Allocation, OrderView, PartitionView, SimView

#: The placement every policy runs with unless told otherwise.
DEFAULT_PLACEMENT = "consolidate"


class Placement:
    """Base class of placements: choose the GPUs of job ``j`` on partition ``p``."""

    #: registry name, e.g. "spread"
    name: ClassVar[str] = ""
    #: one line for ``--help`` and docs
    summary: ClassVar[str] = ""
    #: what the run must provide: "network" (a network model, ``--network``)
    needs: ClassVar[frozenset[str]] = frozenset()
    #: whether the placement picks node sets for a gang of GPUs (False: it is the engine's own placement,
    #: which the server-level elastic engine of the Aryl policies also runs)
    gpu_level: ClassVar[bool] = True
    #: whether the choice depends on the cluster's state alone (no random draws, no clock): the simulator
    #: may then skip a scheduling pass that nothing could change
    deterministic: ClassVar[bool] = True
    #: options this placement accepts (name -> default), set with ``--opt placement.key=value``
    options: ClassVar[dict[str, float | str]] = {}

    #: the simulator's read-only view, set by :meth:`bind`
    sim: SimView
    #: the order the placement runs under (read-only: its name and traits), set by the policy before :meth:`bind`;
    #: None for a placement bound without one
    order: OrderView | None = None

    def __init__(self, **opts: Any) -> None:
        unknown = sorted(set(opts) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise ConfigError(f"placement '{self.name}' has no option {', '.join(unknown)} (its options: {known})")
        self.opts: dict[str, Any] = {**self.options, **opts}
        #: whether the last :meth:`place` that returned None chose to wait (the GPUs were there)
        self.waited = False
        #: False while the simulator places a job for which it has just preempted others: no waiting then
        self.may_wait = True

    def bind(self, sim: SimView) -> None:
        """Attach to the simulator (called by the policy's ``bind``)."""
        self.sim = sim

    def place(self, j: int, p: int, part: PartitionView) -> Allocation | None:
        """The GPUs taken from ``part`` for job ``j``, or None (no fit, or :attr:`waited`)."""
        raise NotImplementedError

    def allocate_as_configured(self, j: int, part: PartitionView) -> Allocation | None:
        """Job ``j``'s GPUs by the run's allocation setting (``SimConfig.placement``, fewest nodes with best fit by
        default): ``consolidate``'s plan, also taken by placements that fall back to it."""
        cfg = self.sim.config
        return part.allocate(self.sim.gpus[j], cfg.placement, cfg.strict_placement)

    def next_wakeup(self, now: float) -> float | None:
        """Absolute time at which the placement wants another scheduling pass (asked after each pass; None: none)."""
        return None


PLACEMENTS: Registry[Placement] = Registry(
    "placement", ConfigError, listing="Available", package="gpufleet.sched.placement", set_name=False, suggest=True
)


def register(cls: type[Placement]) -> type[Placement]:
    """Class decorator: make ``cls`` available as ``--placement cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    return PLACEMENTS.register(cls.name)(cls)


def available_placements() -> dict[str, type[Placement]]:
    """Every registered placement, by name."""
    return dict(PLACEMENTS.items())  # type: ignore[arg-type]


def make_placement(name: str, **opts: Any) -> Placement:
    """Instantiate the placement registered as ``name`` (ConfigError for an unknown name or option)."""
    return PLACEMENTS.create(name, **opts)


def placements_needing(need: str, names: Sequence[str]) -> list[str]:
    """The placements among ``names`` that declare ``need`` (e.g. "network"), sorted."""
    return sorted(n for n in set(names) if n in PLACEMENTS and need in PLACEMENTS[n].needs)  # type: ignore[attr-defined]
