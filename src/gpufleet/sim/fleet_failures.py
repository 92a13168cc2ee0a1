"""A failure study from files: a fleet's telemetry gives the failures, an optional failure model the alerts, and
each policy runs with the failures injected (and with the model's drains). See ``docs/sim_failures.md``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    import polars as pl

    from gpufleet.sim.config import SimConfig
    from gpufleet.sim.result import SimResult
    from gpufleet.spec import ClusterSpec

__all__ = ["DEFAULT_DRAIN_HOURS", "run_with_failures"]

#: Hours a drained node is out when no failure model gives its horizon.
DEFAULT_DRAIN_HOURS = 12.0


def run_with_failures(
    jobs: pl.DataFrame,
    spec: ClusterSpec,
    policies: Sequence[str],
    config: SimConfig,
    opts: dict[str, dict[str, Any]],
    fleet: Path,
    model: Path | None,
    repair_hours: float,
    drain_hours: float | None,
    workers: int = 1,
    on_done: Callable[[SimResult], None] | None = None,
    log: Callable[[str], None] | None = None,
    inference: Any = None,
    elastic: Any = None,
) -> list[SimResult]:
    """Each policy with ``fleet``'s failures injected, and once more with ``model``'s drains when it is given.

    ``drain_hours`` defaults to the model's horizon (so that a right alert's failure falls inside the drain);
    ``log`` receives one line saying how many failures and alerts were read."""
    from gpufleet.health.events import failure_events, predicted_alerts, predictor_horizon_h
    from gpufleet.sim.failure_run import run_failure_study
    from gpufleet.sim.failures import OutageSettings

    if drain_hours is None:
        drain_hours = predictor_horizon_h(model) if model is not None else DEFAULT_DRAIN_HOURS
    if repair_hours <= 0 or drain_hours <= 0:
        raise ConfigError("--repair-hours and --drain-hours must be positive")
    fails = failure_events(fleet)
    alerts = predicted_alerts(model, fleet) if model is not None else None
    if log is not None:
        extra = f", {alerts.height:,} alerts from {model}" if alerts is not None else ""
        log(
            f"{fails.height:,} failures from {fleet}{extra}; fleet time 0 = the trace's first submission, "
            "events after the last job ends are ignored"
        )
    settings = OutageSettings(repair_s=repair_hours * 3600.0, drain_s=drain_hours * 3600.0)
    return run_failure_study(
        jobs,
        spec,
        policies,
        fails,
        alerts,
        config,
        settings,
        opts,
        workers=workers,
        on_done=on_done,
        inference=inference,
        elastic=elastic,
    )
