"""The policy interface: admission order, preemption and timers, behind a registry so ``--policy x`` is a lookup.

A policy ranks jobs with float keys (lower runs first). The simulator owns the mechanics: it keeps the
waiting jobs ordered by ``waiting_key``, starts the best one that fits (with placement), and, for preemptive
policies, preempts running jobs whose ``running_key`` is worse than a waiting job's key. A new policy is one
file in :mod:`gpufleet.sched`: subclass :class:`Policy`, set ``name`` and ``summary``, decorate with
:func:`register`; the registry imports every module of the package, so no list needs the new name.
A policy reads the simulator only through :class:`gpufleet.sched.view.SimView`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.registry import Registry
from gpufleet.sched.placement.base import DEFAULT_PLACEMENT, Placement, make_placement

if TYPE_CHECKING:
    from gpufleet.sched.view import Allocation, PartitionView, SimView


class Policy:
    """Base class of scheduling policies. Subclasses override the key methods and, if needed, the hooks."""

    #: registry name, e.g. "fifo"
    name: ClassVar[str] = ""
    #: one line for ``--help`` and docs
    summary: ClassVar[str] = ""
    #: whether running jobs may be preempted in favour of better waiting jobs
    preemptive: ClassVar[bool] = False
    #: strict head-of-line order: when the best waiting job does not fit, nothing behind it starts
    blocking: ClassVar[bool] = False
    #: running keys change continuously at different rates, so victims are found by scanning, not a heap
    scan_running: ClassVar[bool] = False
    #: a running job's key changes only through ``sim.rekey_running`` (so the heap entry holds it exactly)
    static_running_key: ClassVar[bool] = False
    #: the order ranks jobs by the service they have attained so far (LAS, Tiresias): a job's rank falls while it
    #: runs, so running jobs are preempted and placed again often. Placements read it through
    #: :class:`gpufleet.sched.view.OrderView` (:attr:`gpufleet.sched.placement.base.Placement.order`)
    ranks_by_service: ClassVar[bool] = False
    #: the placement the event core runs the policy with: "gang" (fixed-size jobs on node-level partitions,
    #: ``sim.engine``) or "elastic" (jobs of workers on servers, with loaning and scaling: ``sim.elastic``)
    engine: ClassVar[str] = "gang"
    #: what the run must provide besides jobs and a cluster: "network" (a network model, ``--network``)
    needs: ClassVar[frozenset[str]] = frozenset()
    #: options this policy accepts (name -> default), set with ``--opt policy.name=value``
    options: ClassVar[dict[str, float | str]] = {}
    #: the placement (:mod:`gpufleet.sched.placement`) the policy runs with unless the run names another
    default_placement: ClassVar[str] = DEFAULT_PLACEMENT

    def __init__(self, **opts: Any) -> None:
        unknown = sorted(set(opts) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise ConfigError(f"policy '{self.name}' has no option {', '.join(unknown)} (its options: {known})")
        self.opts: dict[str, Any] = {**self.options, **opts}
        self.placer: Placement = make_placement(self.default_placement)

    def use_placement(self, placement: Placement) -> None:
        """Run with ``placement`` (the placement layer) instead of :attr:`default_placement`."""
        self.placer = placement

    @property
    def placement(self) -> str:
        """The name of the placement this policy runs with."""
        return self.placer.name

    #: the simulator's read-only view, set by :meth:`bind` before any key is asked for (unset until then)
    sim: SimView

    def bind(self, sim: SimView) -> None:
        """Attach to the simulator whose job arrays the keys read (and the placement to it)."""
        self.sim = sim
        self.placer.order = self
        self.placer.bind(sim)

    # -- ranking ---------------------------------------------------------------------------------
    def waiting_key(self, j: int, now: float) -> float:
        """Priority of waiting job ``j`` (lower runs first); constant while the job waits."""
        raise NotImplementedError

    def running_key(self, j: int, now: float) -> float:
        """Priority of running job ``j`` at ``now`` on the same scale as :meth:`waiting_key`."""
        return self.waiting_key(j, now)

    def running_keys(self, jobs: np.ndarray, now: float) -> np.ndarray:
        """:meth:`running_key` of many running jobs at once (scan policies override it with array maths)."""
        return np.array([self.running_key(int(j), now) for j in jobs], dtype=np.float64)

    def running_order_key(self, j: int, now: float) -> float:
        """A key fixed while ``j`` runs that orders running jobs like :meth:`running_key` (heap proxy)."""
        return self.running_key(j, now)

    #: whether :meth:`running_bound` differs from :meth:`running_key` (the heap then orders by the bound)
    bounded_running_key: ClassVar[bool] = False

    def running_bound(self, j: int, now: float) -> float:
        """An upper bound of :meth:`running_key` that orders running jobs exactly like
        :meth:`running_order_key`. A victim search stops at the first job whose bound does not qualify; jobs
        whose bound qualifies but whose key does not are skipped and stay possible victims."""
        return self.running_key(j, now)

    def should_preempt(self, victim_key: float, waiting_key: float) -> bool:
        """Whether a running job with ``victim_key`` gives way to a waiting job with ``waiting_key``."""
        return victim_key > waiting_key

    #: whether a running job's bound never grows while it runs, except through ``sim.rekey_running`` (a static
    #: key, or a remaining time that shrinks): then a job that no waiting job beats when it becomes a possible
    #: victim gives the scheduler no new room, and the simulator skips the pass it would otherwise run
    bound_never_grows: ClassVar[bool] = False

    # -- placement -------------------------------------------------------------------------------
    def place(self, j: int, p: int, part: PartitionView) -> Allocation | None:
        """GPUs for job ``j`` on partition ``p`` (taken from ``part``), or None to leave it waiting.

        The placement layer decides (:attr:`placer`, ``consolidate`` unless the run names another).
        """
        return self.placer.place(j, p, part)

    # -- hooks -----------------------------------------------------------------------------------
    def on_start(self, j: int, now: float) -> None:
        """Called after job ``j`` starts (or restarts)."""

    def on_preempt(self, j: int, now: float) -> None:
        """Called after job ``j`` was preempted and returned to the waiting queue."""

    def on_timer(self, j: int, tag: int, now: float) -> None:
        """Called when a timer set with ``sim.add_timer(t, j, tag)`` fires and is still current."""

    def next_wakeup(self, now: float) -> float | None:
        """Absolute time at which the policy wants a scheduling pass even if nothing else happens."""
        return None


POLICIES: Registry[Policy] = Registry(
    "policy", ConfigError, listing="Available", package="gpufleet.sched", set_name=False, suggest=True
)


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make ``cls`` available as ``--policy cls.name``, with ``cls.summary`` for ``--help``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    return POLICIES.register(cls.name)(cls)


def available_policies() -> dict[str, type[Policy]]:
    """Every registered policy, by name."""
    return dict(POLICIES.items())  # type: ignore[arg-type]


def make_policy(name: str, **opts: Any) -> Policy:
    """Instantiate the policy registered as ``name`` with options ``opts`` (ConfigError for a bad one)."""
    return POLICIES.create(name, **opts)


def policies_needing(need: str, names: Sequence[str]) -> list[str]:
    """The policies among ``names`` that declare ``need`` (e.g. "network"), sorted."""
    return sorted(n for n in set(names) if n in POLICIES and need in POLICIES[n].needs)  # type: ignore[attr-defined]


#: Joins a policy and a placement in a run's label: ``srtf+rl``.
PAIR = "+"


def split_label(label: str) -> tuple[str, str | None]:
    """``"srtf+rl"`` -> ("srtf", "rl"); ``"srtf"`` -> ("srtf", None) (the policy's default placement)."""
    name, sep, placement = label.partition(PAIR)
    return name, (placement if sep else None)


def pair_label(name: str, placement: str | None) -> str:
    """The label of a (policy, placement) run: the plain policy name for its default placement, else ``a+b``."""
    if placement is None or placement == POLICIES.get(name).default_placement:  # type: ignore[attr-defined]
        return name
    return f"{name}{PAIR}{placement}"


def make_scheduler(
    label: str, policy_opts: Mapping[str, Any] | None = None, placement_opts: Mapping[str, Any] | None = None
) -> Policy:
    """The policy of a run label (``srtf`` or ``srtf+rl``) with its placement layer set.

    Under a capacity policy (the Aryl family, ``engine == "elastic"``) a GPU-level placement chooses the node
    set of a job's base demand on the training pool's free GPUs; Aryl's best fit places what it cannot (workers
    that need flexible workers' GPUs or loaned servers) and its knapsack places the extra workers.
    """
    name, placement = split_label(label)
    policy = make_policy(name, **dict(policy_opts or {}))
    if placement is None:
        if placement_opts:
            raise ConfigError(f"'{label}' names no placement to take options {', '.join(sorted(placement_opts))}")
        return policy
    placer = make_placement(placement, **dict(placement_opts or {}))
    policy.use_placement(placer)
    return policy
