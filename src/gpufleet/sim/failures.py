"""GPU failures and predictive drains as node outages the simulator injects into running jobs.

A fleet's failures (one row per hard failure: ``gpu``, ``node``, ``time_s``, ``xid``) and, optionally, a
predictor's alerts (``gpu``, ``node``, ``time_s``, ``score``) become one time-ordered stream of node events
on the simulated cluster (see ``docs/sim_failures.md``):

- **Nodes.** The cluster's training nodes are numbered across its training pools in file order; fleet node
  ``n`` is cluster training node ``n`` (N = training nodes); fleet nodes ``>= N`` are not part of the
  cluster and their failures and alerts are dropped, so every node keeps the fleet's per-node failure
  rate (folding a 20,000-GPU fleet onto 640 GPUs would multiply it by 31). A smaller fleet leaves some
  cluster nodes failure-free.
- **Time.** Fleet time 0 (its first telemetry sample) is aligned to the trace's first submission. The
  simulator stops at the last job's completion: failures and alerts after it are ignored.
- **Failure.** The node goes down at once for ``repair_s``; the jobs on it are killed and restart from
  their last checkpoint. A failure on a node that is already out (under repair or drained) kills no job
  and extends the outage to the end of its own repair; one on a drained node counts as an avoided failure.
- **Drain (with a predictor).** An alert on an in-service node takes it out for ``drain_s`` (an
  inspection): its jobs checkpoint, lose nothing and move elsewhere. Alerts on a node already drained are
  merged into that drain; alerts on a node under repair are ignored. A drain is *true* when its node
  fails during the inspection window, *false* otherwise; a false drain costs exactly ``drain_s`` times
  the node's GPUs of capacity.

The outage schedule does not depend on scheduling, so it is computed once, here; the engine walks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from gpufleet.errors import ConfigError
from gpufleet.sim.partition import Partition

#: Columns the failure frame must have (``gpufleet.health.events.failure_events`` returns them).
FAILURE_COLUMNS = ("gpu", "node", "time_s", "xid")
#: Columns the alert frame must have (``gpufleet.health.events.predicted_alerts`` returns them).
ALERT_COLUMNS = ("gpu", "node", "time_s", "score")

# event kinds of the outage stream
FAIL_DOWN = 0  # a failure takes an in-service node down: its jobs are killed
DRAIN_DOWN = 1  # an alert drains an in-service node: its jobs checkpoint and move
NODE_UP = 2  # the node is back in service
FAIL_AVOIDED = 3  # a failure on a drained node: no job is hit
FAIL_ON_DOWN = 4  # a failure on a node already under repair: no job is hit


@dataclass(frozen=True)
class OutageSettings:
    """How failures and drains play out: repair and inspection times, and the cost of a drain's checkpoint.

    ``drain`` False ignores the alerts (the "no predictor" baseline). ``checkpoint_save_s`` is the time a
    drained job spends writing its checkpoint; it is paid, with ``SimConfig.restart_s``, when it restarts.
    """

    repair_s: float = 24 * 3600.0
    drain_s: float = 12 * 3600.0
    checkpoint_save_s: float = 60.0
    drain: bool = True

    def __post_init__(self) -> None:
        if self.repair_s <= 0 or self.drain_s <= 0:
            raise ConfigError(
                f"repair and drain times must be > 0 (got repair {self.repair_s:g} s, drain {self.drain_s:g} s)"
            )
        if self.checkpoint_save_s < 0:
            raise ConfigError(f"checkpoint_save_s must be >= 0, got {self.checkpoint_save_s:g}")


def _check_frame(frame: pl.DataFrame, required: tuple[str, ...], what: str) -> pl.DataFrame:
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"the {what} frame lacks column(s) {', '.join(missing)} (it has "
            f"{', '.join(frame.columns) or 'none'}); expected {', '.join(required)}"
        )
    out = frame.select(pl.col("node").cast(pl.Int64), pl.col("time_s").cast(pl.Float64))
    if out["node"].null_count() or out["time_s"].null_count() or out["time_s"].is_nan().any():
        raise ConfigError(f"the {what} frame has null node or time_s values; drop those rows first")
    return out


@dataclass
class OutagePlan:
    """The time-ordered node events of one run, in the cluster's terms, with what each drain cost.

    Parallel arrays, one entry per event, sorted by time (ties keep each node's own order): ``time``,
    ``kind`` (``FAIL_DOWN``...), ``part`` and ``node`` (partition index, node within it). For a
    ``DRAIN_DOWN``, ``drain_true`` says whether the node failed during the inspection and ``window_s`` is
    its length; ``gpus`` is the node's GPU count.
    """

    time: list[float]
    kind: list[int]
    part: list[int]
    node: list[int]
    gpus: list[int]
    drain_true: list[bool]
    window_s: list[float]
    settings: OutageSettings

    def __len__(self) -> int:
        return len(self.time)

    @classmethod
    def build(
        cls,
        failures: pl.DataFrame,
        alerts: pl.DataFrame | None,
        partitions: list[Partition],
        origin_s: float = 0.0,
        settings: OutageSettings | None = None,
    ) -> OutagePlan:
        """Map ``failures`` and ``alerts`` (fleet frames) onto ``partitions``; fleet time 0 is ``origin_s``."""
        settings = settings or OutageSettings()
        nodes = [(p, k) for p, part in enumerate(partitions) for k in range(part.nodes)]
        if not nodes:
            raise ConfigError("the cluster has no training node to inject failures into")
        fail = _check_frame(failures, FAILURE_COLUMNS, "failure")
        use_alerts = alerts is not None and settings.drain
        alert = _check_frame(alerts, ALERT_COLUMNS, "alert") if use_alerts else None  # type: ignore[arg-type]
        # one row per item: (cluster node, time, 0 = failure / 1 = alert); a failure sorts before an alert
        # at the same instant (an alert raised as the GPU fails is too late)
        frames = [fail.with_columns(pl.lit(0, pl.Int8).alias("what"))]
        if alert is not None:
            frames.append(alert.with_columns(pl.lit(1, pl.Int8).alias("what")))
        items = (
            pl.concat(frames)
            .filter(pl.col("node") < len(nodes))
            .with_columns((pl.col("time_s") + origin_s).alias("t"))
            .sort(["node", "t", "what"])
        )
        out = _Builder(settings)
        node_col = items["node"].to_list()
        t_col = items["t"].to_list()
        what_col = items["what"].to_list()
        i = 0
        while i < len(node_col):  # one node's items at a time
            g = node_col[i]
            p, k = nodes[g]
            out.start_node(p, k, partitions[p].gpus_per_node)
            while i < len(node_col) and node_col[i] == g:
                if what_col[i] == 0:
                    out.failure(t_col[i])
                else:
                    out.alert(t_col[i])
                i += 1
            out.end_node()
        return out.plan()

    # -- statistics over the events the engine applied (the first ``applied`` of the stream) ---------------
    def summary(self, applied: int) -> dict[str, float | int]:
        """Counts and capacities of the failures and drains among the first ``applied`` events."""
        kinds = np.asarray(self.kind[:applied], dtype=np.int64)
        drains = kinds == DRAIN_DOWN
        true = np.asarray(self.drain_true[:applied], dtype=bool) & drains
        gpu_h = np.asarray(self.gpus[:applied], dtype=np.float64) * np.asarray(self.window_s[:applied]) / 3600.0
        return {
            "failures": int(np.isin(kinds, (FAIL_DOWN, FAIL_AVOIDED, FAIL_ON_DOWN)).sum()),
            "avoided_failures": int((kinds == FAIL_AVOIDED).sum()),
            "drains": int(drains.sum()),
            "drain_true": int(true.sum()),
            "drain_false": int((drains & ~true).sum()),
            "drain_gpu_hours": float(gpu_h[drains].sum()),
            "false_alarm_gpu_hours": float(gpu_h[drains & ~true].sum()),
        }


class _Builder:
    """Walks one node's failures and alerts in time order and emits its outage events."""

    def __init__(self, settings: OutageSettings) -> None:
        self.s = settings
        self.cols: dict[str, list] = {k: [] for k in ("time", "kind", "part", "node", "gpus", "drain_true", "window_s")}

    def start_node(self, part: int, node: int, gpus: int) -> None:
        self.p, self.k, self.g = part, node, gpus
        self.down_until = -np.inf  # the node is out of service before this time
        self.drain_end = -np.inf  # end of the current drain's inspection window
        self.drain_idx = -1  # event index of the current drain (its DRAIN_DOWN)

    def _emit(self, t: float, kind: int, window: float = 0.0) -> int:
        c = self.cols
        for key, v in (
            ("time", t),
            ("kind", kind),
            ("part", self.p),
            ("node", self.k),
            ("gpus", self.g),
            ("drain_true", False),
            ("window_s", window),
        ):
            c[key].append(v)
        return len(c["time"]) - 1

    def _settle(self, t: float) -> None:
        """Bring the node back up if its outage ended by ``t``."""
        if self.down_until != -np.inf and self.down_until <= t:
            self._emit(self.down_until, NODE_UP)
            self.down_until = -np.inf
            self.drain_idx = -1

    def failure(self, t: float) -> None:
        self._settle(t)
        repaired = t + self.s.repair_s
        if self.down_until == -np.inf:
            self._emit(t, FAIL_DOWN)
        elif self.drain_idx >= 0 and t < self.drain_end:
            self._emit(t, FAIL_AVOIDED)
            self.cols["drain_true"][self.drain_idx] = True
        else:
            self._emit(t, FAIL_ON_DOWN)
        self.drain_idx = -1 if t >= self.drain_end else self.drain_idx
        self.down_until = max(self.down_until, repaired)

    def alert(self, t: float) -> None:
        self._settle(t)
        if self.down_until != -np.inf:
            return  # drained already (merged) or under repair (ignored)
        self.drain_end = t + self.s.drain_s
        self.drain_idx = self._emit(t, DRAIN_DOWN, self.s.drain_s)
        self.down_until = self.drain_end

    def end_node(self) -> None:
        self._settle(np.inf)

    def plan(self) -> OutagePlan:
        c = self.cols
        order = np.argsort(np.asarray(c["time"], dtype=np.float64), kind="stable").tolist()
        pick = {k: [v[i] for i in order] for k, v in c.items()}
        return OutagePlan(
            time=[float(x) for x in pick["time"]],
            kind=pick["kind"],
            part=pick["part"],
            node=pick["node"],
            gpus=pick["gpus"],
            drain_true=pick["drain_true"],
            window_s=pick["window_s"],
            settings=self.s,
        )


def empty_failures() -> pl.DataFrame:
    """A failure frame with no rows (the schema ``failure_events`` returns)."""
    return pl.DataFrame(schema={"gpu": pl.UInt32, "node": pl.UInt32, "time_s": pl.Float64, "xid": pl.Int64})


def empty_alerts() -> pl.DataFrame:
    """An alert frame with no rows (the schema ``predicted_alerts`` returns)."""
    return pl.DataFrame(schema={"gpu": pl.UInt32, "node": pl.UInt32, "time_s": pl.Float64, "score": pl.Float64})
