"""A synthetic fleet of GPUs with hourly DCGM telemetry and the failures it ends in.

No public dataset pairs telemetry with failure labels, so the fleet is drawn from published figures
(``facts.py``): the Llama 3 interruption rate and GPU failure mix, XID semantics from NVIDIA's catalog,
precursors real failures show (rising single-bit ECC with row remaps and XID 63/92/94 before XID 48/95,
PCIe replay bursts before a bus drop, NVLink CRC errors before XID 74, a thermal runaway), failures with
no precursor at all, diurnal inference load and job churn driving power and temperature, sensor noise.

What keeps precision honest: healthy GPUs show the same precursor signatures ("decoy" episodes: a remap
that succeeds, a marginal riser, a dirty cable, a node whose fan fails), and the fleet drifts (a driver
roll-out changes when XID 92 fires, summer warms the inlet air, a maintenance leaves some racks with
flaky cables). The file written is the canonical telemetry frame that ``readers.py`` produces from real
exports, plus a sidecar ``<name>.failures.parquet`` with the ground truth of every failure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from gpufleet.health import facts
from gpufleet.health.facts import FAILURE_KINDS

#: The telemetry columns the generator writes, in order (canonical DCGM names).
GAUGES = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
)
COUNTERS = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_POWER_VIOLATION",
)
CODES = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_XID_ERRORS")
FLEET_META_KEY = b"gpufleet.fleet"

# clock-event-reason bits (dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_*)
_IDLE, _SW_POWER, _HW_SLOW, _SW_THERMAL, _HW_THERMAL = 0x1, 0x4, 0x8, 0x20, 0x40
_HOUR_NS = 3.6e12
_SIGNATURES = ("hbm", "pcie", "nvlink", "sram", "app_errors", "thermal")


@dataclass(frozen=True)
class FleetConfig:
    """What fleet to draw. Defaults: the issue's 20,000 GPUs over 120 days from 1 March."""

    gpus: int = 20_000
    days: float = 120.0
    seed: int = 0
    start: datetime = datetime(2024, 3, 1, tzinfo=UTC)
    gpus_per_node: int = 8
    nodes_per_rack: int = 4
    #: multiplies the published failure rate (1.0 = Llama 3's); tests raise it to get failures in a small fleet
    failure_scale: float = 1.0
    #: nodes that serve inference (diurnal load); the rest run training jobs that start and stop
    inference_share: float = 0.3
    #: GPUs with a steady trickle of single-bit errors and occasional benign bursts (assumption)
    leaky_share: float = 0.05
    #: a weaker manufacturing batch (Titan's batch effect, Ostrouchov et al. SC'20): more HBM failures,
    #: rising over time (wear-out)
    weak_batch_share: float = 0.2
    weak_batch_hbm_factor: float = 3.0
    #: decoy episodes (the signature without a failure) per true precursor episode, by signature (assumption;
    #: the drift look-alikes, storms and ageing leakage, come on top and outnumber them late in the span)
    decoys: dict[str, float] = field(
        default_factory=lambda: {
            "hbm": 0.5,
            "pcie": 0.5,
            "nvlink": 0.4,
            "sram": 0.5,
            "app_errors": 0.75,
            "thermal": 1.0,
        }
    )
    #: decoys are milder on average than real precursors (log-normal median ratio), with overlapping tails
    decoy_intensity: float = 0.5
    #: multiply the drift look-alikes (facts.CABLE_STORMS_PER_NODE_DAY, facts.AGING_LEAK_SHARE); 0 turns them off
    storm_scale: float = 1.0
    aging_scale: float = 1.0
    chunk_gpus: int = 2_000

    @property
    def hours(self) -> int:
        return round(self.days * 24)

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)


@dataclass
class FleetSummary:
    """What was generated: sizes, failure counts by kind, and where the files are."""

    path: Path
    failures_path: Path
    gpus: int
    hours: int
    rows: int
    failures: int
    failures_by_kind: dict[str, int]
    with_precursor: int
    decoy_episodes: int


# --------------------------------------------------------------------------------------------- fleet plan
@dataclass
class _Plan:
    """Everything drawn fleet-wide before telemetry: traits, failures and precursor episodes."""

    leaky: np.ndarray
    weak: np.ndarray
    gpu_temp_off: np.ndarray
    power_eff: np.ndarray
    node_inference: np.ndarray
    node_upgrade_h: np.ndarray
    rack_temp_off: np.ndarray
    rack_bad_cables: np.ndarray
    failures: pl.DataFrame  # gpu, hour, kind, xid, precursor, repair_h
    episodes: pl.DataFrame  # gpu, start, end, signature, intensity, true


def _draw_plan(cfg: FleetConfig, rng: np.random.Generator) -> _Plan:
    g = cfg.gpus
    nodes, racks = cfg.nodes, math.ceil(cfg.nodes / cfg.nodes_per_rack)
    weak = rng.random(g) < cfg.weak_batch_share
    bad_cables = rng.random(racks) < facts.MAINTENANCE_RACK_SHARE
    plan_failures = _draw_failures(cfg, rng, weak)
    episodes = pl.concat(
        [_draw_episodes(cfg, rng, plan_failures), _drift_episodes(cfg, rng, weak, bad_cables)], how="vertical_relaxed"
    ).sort("gpu", "start")
    return _Plan(
        leaky=rng.random(g) < cfg.leaky_share,
        weak=weak,
        gpu_temp_off=rng.normal(0.0, 2.5, g).astype(np.float32),
        power_eff=rng.normal(1.0, 0.04, g).astype(np.float32),
        node_inference=rng.random(nodes) < cfg.inference_share,
        node_upgrade_h=((facts.DRIVER_UPGRADE_DAY + rng.uniform(-1, 1, nodes) * facts.DRIVER_ROLLOUT_DAYS) * 24),
        rack_temp_off=rng.normal(0.0, 2.0, racks).astype(np.float32),
        rack_bad_cables=bad_cables,
        failures=plan_failures,
        episodes=episodes,
    )


def _draw_failures(cfg: FleetConfig, rng: np.random.Generator, weak: np.ndarray) -> pl.DataFrame:
    """Failure times per kind at the published rate; HBM failures favour the weak batch and rise with age."""
    g, h = cfg.gpus, cfg.hours
    per_gpu_hour = facts.INTERRUPTIONS_PER_GPU_HOUR * cfg.failure_scale
    rows: list[tuple[int, int, str, int, bool]] = []
    for kind in FAILURE_KINDS:
        n = rng.poisson(per_gpu_hour * kind.share * g * h)
        if kind.name == "hbm":
            w = np.where(weak, cfg.weak_batch_hbm_factor, 1.0)
            gpus = rng.choice(g, size=n, p=w / w.sum())
            # weak-batch HBM wears out: hazard rising linearly in time (Weibull shape 2) -> t = T sqrt(U)
            u = rng.random(n)
            hours = np.where(weak[gpus], h * np.sqrt(u), h * u)
        else:
            gpus = rng.integers(0, g, n)
            hours = rng.random(n) * h
        has = rng.random(n) < kind.precursor_prob
        if kind.name == "gsp":  # the driver roll-out brings more GSP failures, most with a visible precursor
            up = min(facts.DRIVER_UPGRADE_DAY * 24, h)
            w_after = facts.GSP_AFTER_UPGRADE_FACTOR * (h - up)
            after = rng.random(n) < w_after / (up + w_after)
            hours = np.where(after, up + rng.random(n) * (h - up), rng.random(n) * up)
            has = rng.random(n) < np.where(after, facts.GSP_PRECURSOR_AFTER, kind.precursor_prob)
        xids = rng.choice(np.array(kind.xids), size=n)
        rows += [
            (int(a), int(b), kind.name, int(c), bool(d)) for a, b, c, d in zip(gpus, hours, xids, has, strict=True)
        ]
    frame = pl.DataFrame(
        rows,
        schema={"gpu": pl.UInt32, "hour": pl.Int64, "kind": pl.Utf8, "xid": pl.Int64, "precursor": pl.Boolean},
        orient="row",
    ).sort("gpu", "hour")
    repair = np.clip(rng.lognormal(math.log(facts.REPAIR_MEDIAN_H), 0.5, frame.height), 4, 240).astype(np.int64)
    frame = frame.with_columns(repair_h=pl.Series(repair))
    # a GPU under repair cannot fail again: drop failures inside an earlier one's repair window
    keep, last_gpu, busy_until = [], -1, -1
    for gpu, hour, rep in zip(
        frame["gpu"].to_list(), frame["hour"].to_list(), frame["repair_h"].to_list(), strict=True
    ):
        ok = not (gpu == last_gpu and hour <= busy_until)
        keep.append(ok)
        if ok:
            last_gpu, busy_until = gpu, hour + rep
    return frame.filter(pl.Series(keep))


def _draw_episodes(cfg: FleetConfig, rng: np.random.Generator, failures: pl.DataFrame) -> pl.DataFrame:
    """Precursor episodes before failures (ramping into them) and decoys on healthy GPUs (rising, then fading)."""
    g, h = cfg.gpus, cfg.hours
    per_gpu_hour = facts.INTERRUPTIONS_PER_GPU_HOUR * cfg.failure_scale
    kinds = {k.name: k for k in FAILURE_KINDS}
    parts = []
    true = failures.filter(pl.col("precursor"))
    for sig in _SIGNATURES:
        mine = true.filter(pl.col("kind").is_in([k.name for k in FAILURE_KINDS if k.precursor == sig]))
        median = np.array([kinds[k].median_lead_h for k in mine["kind"].to_list()], dtype=float)
        lead = np.clip(rng.lognormal(np.log(np.maximum(median, 1.0)), 0.45), 6, 168).astype(np.int64)
        end = mine["hour"].to_numpy()
        parts.append(
            pl.DataFrame(
                {
                    "gpu": mine["gpu"],
                    "start": end - lead,
                    "end": end,
                    "signature": [sig] * mine.height,
                    "intensity": rng.lognormal(0.0, 0.5, mine.height),
                    "true": [True] * mine.height,
                },
                schema_overrides={"start": pl.Int64, "end": pl.Int64},
            )
        )
        # decoys: as many as the expected number of true episodes of this signature times the ratio
        expected = sum(k.share * k.precursor_prob for k in FAILURE_KINDS if k.precursor == sig)
        n = rng.poisson(expected * per_gpu_hour * g * h * cfg.decoys.get(sig, 0.0))
        if sig == "thermal":  # a node-level event (a failing fan): every GPU of the node heats together
            gpus, reps = _whole_nodes(rng.integers(0, cfg.nodes, n), cfg.gpus_per_node), cfg.gpus_per_node
        else:
            gpus, reps = rng.integers(0, g, n), 1
        med = float(np.mean([k.median_lead_h for k in FAILURE_KINDS if k.precursor == sig] or [24.0]))
        length = np.repeat(np.clip(rng.lognormal(math.log(med), 0.6, n), 6, 240).astype(np.int64), reps)
        start = np.repeat(rng.integers(-24, h, n), reps)
        inten = np.repeat(rng.lognormal(math.log(cfg.decoy_intensity), 0.5, n), reps)
        parts.append(_look_alikes(g, gpus, start, start + length, sig, inten))
    return pl.concat(parts, how="vertical_relaxed").sort("gpu", "start")


def _whole_nodes(node: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Every GPU of each node in ``node``, node by node (for node-level episodes)."""
    return (node[:, None] * gpus_per_node + np.arange(gpus_per_node)[None, :]).ravel()


def _look_alikes(
    g: int, gpus: np.ndarray, start: np.ndarray, end: np.ndarray, signature: str, intensity: np.ndarray
) -> pl.DataFrame:
    """Episodes on healthy GPUs (no failure follows), dropping GPUs past the fleet's last node."""
    ok = gpus < g
    n = int(ok.sum())
    return pl.DataFrame(
        {
            "gpu": gpus[ok].astype(np.uint32),
            "start": start[ok].astype(np.int64),
            "end": end[ok].astype(np.int64),
            "signature": [signature] * n,
            "intensity": intensity[ok].astype(np.float64),
            "true": [False] * n,
        },
        schema_overrides={"signature": pl.Utf8, "true": pl.Boolean},
    )


def _drift_episodes(
    cfg: FleetConfig, rng: np.random.Generator, weak: np.ndarray, bad_racks: np.ndarray
) -> pl.DataFrame:
    """Look-alikes that appear as the fleet drifts: node-wide PCIe replay storms on the racks a maintenance left
    with loose cables (after it), and benign single-bit leakage of the ageing weak batch (more and more of it)."""
    g, h, gpn = cfg.gpus, cfg.hours, cfg.gpus_per_node
    parts = []
    first = int(facts.MAINTENANCE_DAY * 24)
    bad_nodes = np.flatnonzero(np.repeat(bad_racks, cfg.nodes_per_rack)[: cfg.nodes])
    if first < h and len(bad_nodes):
        n = rng.poisson(facts.CABLE_STORMS_PER_NODE_DAY * len(bad_nodes) * (h - first) / 24 * cfg.storm_scale)
        gpus = _whole_nodes(rng.choice(bad_nodes, n), gpn)
        start = np.repeat(rng.integers(first, h, n), gpn)
        length = np.repeat(np.clip(rng.lognormal(math.log(48.0), 0.6, n), 6, 240).astype(np.int64), gpn)
        inten = np.repeat(rng.lognormal(math.log(cfg.decoy_intensity), 0.5, n), gpn)
        parts.append(_look_alikes(g, gpus, start, start + length, "pcie_storm", inten))
    weak_ids = np.flatnonzero(weak)
    n = rng.binomial(len(weak_ids), min(1.0, facts.AGING_LEAK_SHARE * cfg.aging_scale))
    if n:
        gpus = rng.choice(weak_ids, n, replace=False)
        start = (h * np.sqrt(rng.random(n))).astype(np.int64)  # hazard rising linearly in time
        length = np.clip(rng.lognormal(math.log(facts.AGING_LEAK_MEDIAN_H), 0.5, n), 48, 2 * h).astype(np.int64)
        inten = rng.lognormal(math.log(cfg.decoy_intensity), 0.5, n)
        parts.append(_look_alikes(g, gpus, start, start + length, "sbe_aging", inten))
    empty = np.zeros(0, dtype=np.int64)
    return pl.concat(parts or [_look_alikes(g, empty, empty, empty, "", np.zeros(0))], how="vertical_relaxed")


# --------------------------------------------------------------------------------------------- telemetry
def _normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Standard normal noise in float32 (half the memory and time of float64 at this size)."""
    return rng.standard_normal(shape, dtype=np.float32)


def _sparse_counts(
    rng: np.random.Generator, shape: tuple[int, int], rate: np.ndarray, size: Callable[[int], np.ndarray] | None = None
) -> np.ndarray:
    """Rare events per (row, hour) at ``rate[row]`` per hour, drawn sparsely: the number of events per row,
    then their hours; ``size`` draws how many counts each event adds (1 each by default)."""
    n, h = shape
    out = np.zeros(shape, dtype=np.float32)
    per_row = rng.poisson(rate * h)
    rows = np.repeat(np.arange(n), per_row)
    cols = rng.integers(0, h, len(rows)) if h else np.zeros(0, dtype=np.int64)
    np.add.at(out, (rows, cols), 1.0 if size is None else size(len(rows)).astype(np.float32))
    return out


def _profile(n: int, true: bool, signature: str = "") -> np.ndarray:
    """Episode intensity over its hours: true ones ramp up into the failure, decoys rise and fade, ageing
    leakage climbs and stays."""
    tau = (np.arange(n) + 1.0) / n
    if signature == "sbe_aging":
        return np.minimum(1.0, 2.0 * tau)
    return np.exp(3.0 * (tau - 1.0)) if true else np.sin(np.pi * tau) ** 2


def _node_util(
    cfg: FleetConfig, rng: np.random.Generator, inference: np.ndarray, hour_of_day: np.ndarray, day: np.ndarray
) -> np.ndarray:
    """GPU utilisation per node and hour: diurnal inference load, or training jobs that start and stop."""
    n, h = len(inference), len(hour_of_day)
    util = np.empty((n, h), dtype=np.float32)
    # inference: the diurnal curve of serving load (peak mid-afternoon, trough before dawn), weekly dip
    diurnal = 0.5 - 0.5 * np.cos(2 * np.pi * (hour_of_day - 3) / 24)
    weekly = np.where((day.astype(int) % 7) >= 5, 0.8, 1.0)
    inf_level = rng.uniform(0.6, 1.0, n)[:, None]
    util[:] = (15 + 70 * diurnal * weekly)[None, :] * inf_level
    # training: busy/idle two-state chain (mean busy 40 h, mean idle 5 h)
    train = ~inference
    busy = rng.random(train.sum()) < 0.9
    states = np.empty((train.sum(), h), dtype=bool)
    flips = rng.random((train.sum(), h))
    for t in range(h):
        busy = np.where(busy, flips[:, t] >= 1 / 40, flips[:, t] < 1 / 5)
        states[:, t] = busy
    util[train] = np.where(states, 93.0, 2.0)
    return util


def _chunk(cfg: FleetConfig, plan: _Plan, g0: int, g1: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Hourly telemetry of GPUs ``g0..g1`` (whole nodes): one (gpus, hours) array per column."""
    h, gpn = cfg.hours, cfg.gpus_per_node
    gpus = np.arange(g0, g1)
    n = len(gpus)
    hours = np.arange(h)
    day = hours / 24.0
    hour_of_day = (cfg.start.hour + hours) % 24
    node = gpus // gpn
    rack = node // cfg.nodes_per_rack
    nodes = np.unique(node)
    node_util = _node_util(cfg, rng, plan.node_inference[nodes], hour_of_day, day)
    util = np.clip(node_util[node - nodes[0]] + 3 * _normal(rng, (n, h)), 0, 100)

    demand = 75 + 625 * util / 100 * plan.power_eff[gpus, None] + 8 * _normal(rng, (n, h))
    capped = demand > 690
    power = np.minimum(demand, np.float32(690))
    inlet = (
        21
        + plan.rack_temp_off[rack, None]
        + facts.SEASONAL_WARMING_C_PER_DAY * day[None, :]
        + 1.2 * np.sin(2 * np.pi * (hour_of_day - 10) / 24)[None, :]
    )
    slot_off = (gpus % gpn) * 0.8
    temp = (
        inlet.astype(np.float32)
        + 0.065 * power
        + (slot_off[:, None] + plan.gpu_temp_off[gpus, None])
        + 0.8 * _normal(rng, (n, h))
    )
    mem_extra = np.zeros((n, h), dtype=np.float32)

    leaky = plan.leaky[gpus]
    sbe = _sparse_counts(rng, (n, h), np.where(leaky, 0.01, 0.0003))
    sbe += _sparse_counts(rng, (n, h), np.where(leaky, 0.003, 0.0), size=lambda k: rng.poisson(7, k))
    dbe = np.zeros((n, h), dtype=np.float32)
    remap_c = np.zeros((n, h), dtype=np.float32)
    remap_u = np.zeros((n, h), dtype=np.float32)
    pending = np.zeros((n, h), dtype=bool)
    pcie = _sparse_counts(rng, (n, h), np.full(n, 0.01))
    bad_rows = plan.rack_bad_cables[rack]
    first_bad = min(int(facts.MAINTENANCE_DAY * 24), h)
    pcie[:, first_bad:] += _sparse_counts(
        rng, (n, h - first_bad), np.where(bad_rows, 0.004, 0.0), size=lambda k: rng.poisson(12, k)
    )
    crc = _sparse_counts(rng, (n, h), np.full(n, 0.005))
    xid = np.zeros((n, h), dtype=np.int64)
    rank = np.zeros((n, h), dtype=np.int8)  # severity of the XID held in ``xid``: 1 benign, 2 precursor, 3 hard

    def put_xid(rows: np.ndarray, cols: np.ndarray, code: int | np.ndarray, sev: int) -> None:
        better = rank[rows, cols] < sev
        xid[rows[better], cols[better]] = code if np.isscalar(code) else np.asarray(code)[better]
        rank[rows[better], cols[better]] = sev

    # benign application XIDs on busy GPUs
    r, c = np.nonzero(_sparse_counts(rng, (n, h), np.full(n, 0.0015)))
    busy = util[r, c] > 20
    r, c = r[busy], c[busy]
    put_xid(r, c, rng.choice(np.array(facts.BENIGN_APP_XIDS), len(r)), 1)

    for ep in plan.episodes.filter((pl.col("gpu") >= g0) & (pl.col("gpu") < g1)).iter_rows(named=True):
        i = ep["gpu"] - g0
        s, e = max(ep["start"], 0), min(ep["end"], h)
        if e <= s:
            continue
        prof = (
            _profile(ep["end"] - ep["start"], ep["true"], ep["signature"])[s - ep["start"] : e - ep["start"]]
            * ep["intensity"]
        )
        span = slice(s, e)
        sig = ep["signature"]
        if sig in ("hbm", "sram"):
            peak = 18.0 if sig == "hbm" else 8.0
            sbe[i, span] += rng.poisson(0.3 + peak * prof)
            mem_extra[i, span] += 2.5 * prof
            if sig == "hbm":
                events = rng.random(e - s) < 0.06 * prof
                remap_c[i, span] += events
                for k in np.nonzero(events)[0]:
                    pending[i, s + k : min(s + k + int(rng.integers(6, 48)), h)] = True
                put_xid(np.full(events.sum(), i), s + np.nonzero(events)[0], facts.XID_REMAP_EVENT, 2)
                # uncorrectable (contained) errors only on the way to a failure: a look-alike is a remap
                # that succeeds, with correctable errors alone
                contained = rng.random(e - s) < (0.015 * prof if ep["true"] else 0.0)
                remap_u[i, span] += contained
                dbe[i, span] += contained
                put_xid(np.full(contained.sum(), i), s + np.nonzero(contained)[0], facts.XID_CONTAINED, 2)
        elif sig in ("pcie", "pcie_storm"):
            pcie[i, span] += rng.poisson(0.5 + 60 * prof)
        elif sig == "sbe_aging":  # correctable errors only: no remaps, no contained errors
            sbe[i, span] += rng.poisson(0.2 + 12.0 * prof)
        elif sig == "nvlink":
            crc[i, span] += rng.poisson(0.2 + 30 * prof)
        elif sig == "app_errors":
            hits = np.nonzero(rng.random(e - s) < 0.12 * prof + 0.02)[0]
            put_xid(np.full(len(hits), i), s + hits, rng.choice(np.array((13, 31)), len(hits)), 1)
        elif sig == "thermal":
            temp[i, span] += (18.0 if ep["true"] else 10.0) * prof

    # XID 92 fires when the hour's single-bit count passes the driver's threshold; the new driver's is lower
    upgraded = hours[None, :] >= plan.node_upgrade_h[node][:, None]
    thr = np.where(upgraded, facts.XID92_SBE_PER_HOUR_NEW, facts.XID92_SBE_PER_HOUR_OLD)
    r, c = np.nonzero(sbe >= thr)
    put_xid(r, c, facts.XID_EXCESSIVE_SBE, 2)

    mem_temp = temp + 5 + mem_extra + _normal(rng, (n, h))
    hw_thermal = temp >= 87
    reasons = (
        np.where(util < 5, _IDLE, 0)
        | np.where(capped, _SW_POWER, 0)
        | np.where(temp >= 84, _SW_THERMAL, 0)
        | np.where(hw_thermal, _HW_THERMAL | _HW_SLOW, 0)
    ).astype(np.int64)
    sm_clock = np.where(util < 5, 345.0, 1980.0) - np.where(capped, 80.0, 0.0) - 40.0 * np.clip(temp - 84, 0, None)
    sm_clock = (sm_clock + 5 * _normal(rng, (n, h))).astype(np.float32)
    thermal_ns = np.clip((temp - 85) / 5, 0, 1) * np.float32(_HOUR_NS)
    power_ns = np.where(capped, np.float32(0.3 * _HOUR_NS), np.float32(0))
    replay = np.zeros((n, h), dtype=np.float32)
    r, c = np.nonzero(crc)
    replay[r, c] = rng.poisson(0.3 * crc[r, c])

    # failures: the hard XID at the failure hour, missing telemetry while under repair, counters reset after
    alive = np.ones((n, h), dtype=bool)
    resets: list[tuple[int, int]] = []
    for f in plan.failures.filter((pl.col("gpu") >= g0) & (pl.col("gpu") < g1)).iter_rows(named=True):
        i, t = f["gpu"] - g0, f["hour"]
        if t >= h:
            continue
        xid[i, t], rank[i, t] = f["xid"], 3
        if f["kind"] == "hbm":
            dbe[i, t] += 1
        alive[i, t + 1 : t + 1 + f["repair_h"]] = False
        if t + 1 + f["repair_h"] < h:
            resets.append((i, t + 1 + f["repair_h"]))

    def cumulative(inc: np.ndarray) -> np.ndarray:
        total = np.cumsum(inc, axis=1, dtype=np.float32)
        for i, t in resets:  # a repaired or replaced GPU starts its counters again
            total[i, t:] -= total[i, t - 1]
        return total.astype(np.float32)

    cols = {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_MEMORY_TEMP": mem_temp,
        "DCGM_FI_DEV_SM_CLOCK": sm_clock,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": pending.astype(np.float32),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": cumulative(sbe),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": cumulative(dbe),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": cumulative(remap_c),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": cumulative(remap_u),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": cumulative(pcie),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": cumulative(crc),
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": cumulative(replay),
        "DCGM_FI_DEV_THERMAL_VIOLATION": cumulative(thermal_ns),
        "DCGM_FI_DEV_POWER_VIOLATION": cumulative(power_ns),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": reasons,
        "DCGM_FI_DEV_XID_ERRORS": xid,
    }
    cols["_alive"] = alive
    return cols


def _chunk_frame(cfg: FleetConfig, g0: int, cols: dict[str, np.ndarray]) -> pl.DataFrame:
    """The canonical long frame of one chunk: rows by gpu then hour, nulls while a GPU is under repair."""
    alive = cols.pop("_alive")
    n, h = alive.shape
    gpu = np.repeat(np.arange(g0, g0 + n, dtype=np.uint32), h)
    start_ms = int(cfg.start.timestamp() * 1000)
    time_ms = np.tile(start_ms + np.arange(h, dtype=np.int64) * 3_600_000, n)
    dead = ~alive.ravel()
    data: dict[str, pl.Series] = {
        "gpu": pl.Series("gpu", gpu),
        "node": pl.Series("node", gpu // cfg.gpus_per_node),
        "time": pl.Series("time", time_ms).cast(pl.Datetime("ms", "UTC")),
    }
    for name, arr in cols.items():
        flat = arr.ravel()
        s = pl.Series(name, flat.astype(np.int64)) if name in CODES else pl.Series(name, flat.astype(np.float32))
        data[name] = s
    frame = pl.DataFrame(data)
    if dead.any():
        mask = pl.Series(dead)
        frame = frame.with_columns([pl.when(mask).then(None).otherwise(pl.col(c)).alias(c) for c in cols])
    return frame


def generate_fleet(cfg: FleetConfig, out: Path, progress: Callable[[int, int], None] | None = None) -> FleetSummary:
    """Draw the fleet and write its telemetry to ``out`` (Parquet) and its failures beside it."""
    import pyarrow.parquet as pq

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    plan = _draw_plan(cfg, rng)
    meta = {
        "config": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(cfg).items()},
        "hours": cfg.hours,
        "generator": "gpufleet.health.generator",
    }
    writer = None
    rows = 0
    step = max(cfg.gpus_per_node, cfg.chunk_gpus // cfg.gpus_per_node * cfg.gpus_per_node)
    pending: Future | None = None
    # the next chunk is drawn while the previous one is compressed and written (both release the GIL)
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            for g0 in range(0, cfg.gpus, step):
                g1 = min(g0 + step, cfg.gpus)
                chunk_rng = np.random.default_rng([cfg.seed, g0])
                table = _chunk_frame(cfg, g0, _chunk(cfg, plan, g0, g1, chunk_rng)).to_arrow()
                if writer is None:
                    schema = table.schema.with_metadata({FLEET_META_KEY: json.dumps(meta).encode()})
                    # dictionary pages only where values repeat: on noisy floats they cost time and space
                    writer = pq.ParquetWriter(out, schema, compression="zstd", use_dictionary=["gpu", "node", *CODES])
                if pending is not None:
                    pending.result()
                pending = pool.submit(writer.write_table, table.cast(schema))
                rows += table.num_rows
                if progress:
                    progress(g1, cfg.gpus)
            if pending is not None:
                pending.result()
        finally:
            if writer is not None:
                writer.close()
    truth = failures_truth(cfg, plan.failures)
    truth_path = out.with_name(out.stem + ".failures.parquet")
    truth.write_parquet(truth_path)
    return FleetSummary(
        path=out,
        failures_path=truth_path,
        gpus=cfg.gpus,
        hours=cfg.hours,
        rows=rows,
        failures=truth.height,
        failures_by_kind=dict(truth.group_by("kind").len().sort("kind").iter_rows()),
        with_precursor=int(truth["precursor"].sum()),
        decoy_episodes=int((~plan.episodes["true"]).sum()),
    )


def failures_truth(cfg: FleetConfig, failures: pl.DataFrame) -> pl.DataFrame:
    """The ground truth of the generated failures (inside the fleet's span), with calendar times."""
    start = pl.lit(cfg.start).cast(pl.Datetime("ms", "UTC"))
    return (
        failures.filter(pl.col("hour") < cfg.hours)
        .with_columns(
            node=(pl.col("gpu") // cfg.gpus_per_node).cast(pl.UInt32),
            time=start + pl.duration(hours=pl.col("hour")),
        )
        .select("gpu", "node", "time", "hour", "kind", "xid", "precursor", "repair_h")
    )
