"""Canonical hourly telemetry as dense per-GPU arrays, reduced to coarse time bins.

Window features and sequences are read from bins (default 6 hours), not from hourly rows: a bin holds
per-channel aggregates (gauge means and maxima, counter increments, hours with throttle bits, XID counts
by class, counter levels), so a 7-day window is 28 steps and 20,000 GPUs x 120 days fit in about a
gigabyte. Counter increments survive resets (a repaired GPU starts again at zero) and gaps (a GPU off
the exporter): the counter is carried forward over the gap and a drop counts as a restart.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl

from gpufleet.errors import HealthError
from gpufleet.health import xid as xid_catalog

#: gauges averaged per bin (name -> DCGM field)
GAUGES = {
    "temp": "DCGM_FI_DEV_GPU_TEMP",
    "mem_temp": "DCGM_FI_DEV_MEMORY_TEMP",
    "power": "DCGM_FI_DEV_POWER_USAGE",
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "sm_clock": "DCGM_FI_DEV_SM_CLOCK",
    "remap_pending": "DCGM_FI_DEV_ROW_REMAP_PENDING",
}
#: counters summed as increments per bin
COUNTERS = {
    "sbe": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dbe": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "remap_c": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "remap_u": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "pcie_replay": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "nvlink_crc": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "nvlink_replay": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "thermal_viol_s": "DCGM_FI_DEV_THERMAL_VIOLATION",
    "power_viol_s": "DCGM_FI_DEV_POWER_VIOLATION",
}
#: counters whose level (value since the last reset) is also a channel
LEVELS = ("sbe", "remap_c", "remap_u", "pcie_replay")
REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
XID = "DCGM_FI_DEV_XID_ERRORS"
_HW_BITS = 0x8 | 0x40 | 0x80  # HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE
_SW_THERMAL = 0x20
_VIOLATION_NS_TO_S = 1e-9

CHANNELS: tuple[str, ...] = (
    *GAUGES,
    "temp_max",
    "temp_vs_node",
    *COUNTERS,
    "pcie_vs_node",
    *(f"{c}_level" for c in LEVELS),
    "hw_throttle_h",
    "sw_thermal_h",
    "xid63",
    "xid92",
    "xid94",
    "xid_benign",
    "xid_other",
    "xid_hard",
    "alive_h",
)


@dataclass
class FleetArrays:
    """Binned telemetry of a fleet: ``bins[g, b, c]`` for GPU ``g``, bin ``b``, channel ``CHANNELS[c]``."""

    bins: np.ndarray  # (gpus, n_bins, channels) float32, NaN where the GPU reported nothing in the bin
    bin_h: int
    hours: int
    start: datetime
    node: np.ndarray  # (gpus,) node code of each GPU
    failure_gpu: np.ndarray  # hard-XID failures: GPU and hour (sorted by gpu, then hour)
    failure_hour: np.ndarray
    failure_xid: np.ndarray
    alive_end: np.ndarray  # (gpus, n_bins) bool: the GPU reported in the last hour of the bin
    channels: tuple[str, ...] = CHANNELS
    meta: dict = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.bins.shape[0]

    @property
    def n_bins(self) -> int:
        return self.bins.shape[1]

    def channel(self, name: str) -> int:
        return self.channels.index(name)

    def until(self, hours: int) -> FleetArrays:
        """The fleet up to ``hours`` since its start (whole bins), with the failures before then."""
        nb = min(self.n_bins, hours // self.bin_h)
        keep = self.failure_hour < nb * self.bin_h
        return replace(
            self,
            bins=self.bins[:, :nb],
            alive_end=self.alive_end[:, :nb],
            hours=nb * self.bin_h,
            **self._failures(keep),
        )

    def first_gpus(self, gpus: int) -> FleetArrays:
        """The fleet's first ``gpus`` GPUs, with their failures (a sample for the costlier models)."""
        return replace(
            self,
            bins=self.bins[:gpus],
            alive_end=self.alive_end[:gpus],
            node=self.node[:gpus],
            **self._failures(self.failure_gpu < gpus),
        )

    def _failures(self, keep: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "failure_gpu": self.failure_gpu[keep],
            "failure_hour": self.failure_hour[keep],
            "failure_xid": self.failure_xid[keep],
        }


class _Columns:
    """Columns of a frame, or of a Parquet file read one column at a time (a 20,000-GPU fleet's full frame
    would take several GB; one column at a time takes a few hundred MB)."""

    def __init__(self, source: pl.DataFrame | Path) -> None:
        self.frame = source if isinstance(source, pl.DataFrame) else None
        self._keys: dict[str, pl.Series] = {}
        self.path = None if isinstance(source, pl.DataFrame) else source
        self.names = set(self.frame.columns) if self.frame is not None else set(pl.read_parquet_schema(source))
        self.height = (
            self.frame.height if self.frame is not None else pl.scan_parquet(source).select(pl.len()).collect().item()
        )

    def __contains__(self, col: str) -> bool:
        return col in self.names

    def __getitem__(self, col: str) -> pl.Series:
        if self.frame is not None:
            return self.frame[col]
        if col in self._keys:
            return self._keys[col]
        series = pl.read_parquet(self.path, columns=[col]).to_series()
        if col in ("gpu", "node", "time"):  # read more than once
            self._keys[col] = series
        return series

    def is_empty(self) -> bool:
        return self.height == 0


def _hour_grid(frame: _Columns) -> tuple[np.ndarray, int, int, datetime]:
    """Flat (gpu, hour) positions of the rows on the dense grid, the grid's size, and its start."""
    if frame.is_empty():
        raise HealthError("telemetry is empty: no rows to build features from")
    for col in ("gpu", "time"):
        if col not in frame:
            raise HealthError(f"telemetry lacks the '{col}' column; read exports with gpufleet.health.readers")
    start = frame["time"].min().replace(minute=0, second=0, microsecond=0)
    hour = ((frame["time"].dt.epoch("ms") - int(start.timestamp() * 1000)) // 3_600_000).to_numpy()
    gpu = frame["gpu"].cast(pl.Int64).to_numpy()
    gpus, hours = int(gpu.max()) + 1, int(hour.max()) + 1
    return gpu * hours + hour, gpus, hours, start


def _dense(frame: _Columns, col: str, flat: np.ndarray, gpus: int, hours: int, dtype=np.float32) -> np.ndarray:
    """One column on the dense (gpus, hours) grid; NaN (or 0 for codes) where a GPU has no row."""
    fill = np.nan if np.issubdtype(dtype, np.floating) else 0
    out = np.full(gpus * hours, fill, dtype=dtype)
    if col in frame:
        values = frame[col]
        out[flat] = values.fill_null(fill if fill == 0 else float("nan")).to_numpy().astype(dtype, copy=False)
    return out.reshape(gpus, hours)


def _increments(level: np.ndarray) -> np.ndarray:
    """Hourly increments of a cumulative counter, carried over gaps; a drop is a restart from zero."""
    gappy = np.isnan(level).any(axis=1)
    # the first reading is the baseline, not an increment: a real export starts at a lifetime total
    inc = np.diff(level, axis=1, prepend=level[:, :1])
    drop = inc < 0
    inc[drop] = level[drop]
    if gappy.any():
        inc[gappy] = _increments_with_gaps(level[gappy])
    return inc


def _increments_with_gaps(level: np.ndarray) -> np.ndarray:
    """``_increments`` for rows with missing hours: the last value is carried over the gap first."""
    valid = ~np.isnan(level)
    idx = np.where(valid, np.arange(level.shape[1])[None, :], 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    filled = np.take_along_axis(level, idx, axis=1)
    filled = np.where(np.isnan(filled), 0.0, filled)
    inc = np.diff(filled, axis=1, prepend=0.0)
    dropped = inc < 0
    inc[dropped] = filled[dropped]
    inc[~valid] = 0.0
    first = np.argmax(valid, axis=1)  # each row's first reading is its baseline
    inc[np.arange(len(inc)), first] = 0.0
    return inc


def _bin_reduce(x: np.ndarray, bin_h: int, how: str) -> np.ndarray:
    """(gpus, hours) -> (gpus, bins) by ``how`` in {mean, max, sum, last}; NaN when a bin has no value."""
    g, h = x.shape
    nb = h // bin_h
    v = x[:, : nb * bin_h].reshape(g, nb, bin_h)
    with np.errstate(invalid="ignore", divide="ignore"):
        if how == "sum":
            return np.nansum(v, axis=2)
        if how == "last":
            valid = ~np.isnan(v)
            pos = bin_h - 1 - np.argmax(valid[:, :, ::-1], axis=2)
            out = np.take_along_axis(v, pos[:, :, None], axis=2)[:, :, 0]
            return out
        count = (~np.isnan(v)).sum(axis=2)
        if how == "mean":
            out = np.nansum(v, axis=2) / count
        else:
            out = np.where(count > 0, np.max(np.where(np.isnan(v), -np.inf, v), axis=2), np.nan)
        return out.astype(np.float32)


def _node_relative(temp: np.ndarray, node: np.ndarray) -> np.ndarray:
    """Each GPU's binned value minus the median of its node's GPUs in that bin (a peer comparison)."""
    order = np.argsort(node, kind="stable")
    _, starts, counts = np.unique(node[order], return_index=True, return_counts=True)
    out = np.full_like(temp, np.nan)
    with warnings.catch_warnings():  # a bin where a whole node is down has no median: NaN is the answer
        warnings.simplefilter("ignore", RuntimeWarning)
        if np.all(counts == counts[0]):
            grouped = temp[order].reshape(len(counts), counts[0], -1)
            med = np.nanmedian(grouped, axis=1, keepdims=True) if counts[0] > 1 else grouped
            out[order] = (grouped - med).reshape(temp.shape)
            return out
        for s, c in zip(starts, counts, strict=True):
            rows = order[s : s + c]
            out[rows] = temp[rows] - np.nanmedian(temp[rows], axis=0, keepdims=True)
    return out


def build_arrays(source: pl.DataFrame | str | Path, bin_h: int = 6) -> FleetArrays:
    """Read canonical hourly telemetry (a frame or a Parquet file) into binned per-GPU arrays."""
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.exists():
            raise HealthError(f"{path}: no such telemetry file")
        frame = _Columns(path)
    else:
        frame = _Columns(source)
    flat, gpus, hours, start = _hour_grid(frame)
    if hours < bin_h:
        raise HealthError(f"telemetry spans {hours} h, shorter than one {bin_h}-hour bin")
    node = np.zeros(gpus, dtype=np.int64)
    gpu_col = frame["gpu"].cast(pl.Int64).to_numpy()
    node[gpu_col] = frame["node"].cast(pl.Int64).to_numpy() if "node" in frame else gpu_col
    nb = hours // bin_h
    bins = np.full((gpus, nb, len(CHANNELS)), np.nan, dtype=np.float32)
    ch = {name: i for i, name in enumerate(CHANNELS)}

    alive = np.zeros((gpus, hours), dtype=bool)  # a GPU is up in an hour where it reported any field
    for name, col in GAUGES.items():
        x = _dense(frame, col, flat, gpus, hours)
        alive |= ~np.isnan(x)
        bins[:, :, ch[name]] = _bin_reduce(x, bin_h, "mean")
        if name == "temp":
            bins[:, :, ch["temp_max"]] = _bin_reduce(x, bin_h, "max")
    bins[:, :, ch["temp_vs_node"]] = _node_relative(bins[:, :, ch["temp"]], node)
    for name, col in COUNTERS.items():
        level = _dense(frame, col, flat, gpus, hours)
        alive |= ~np.isnan(level)
        inc = _increments(level)
        if name.endswith("_viol_s"):
            inc *= _VIOLATION_NS_TO_S
        bins[:, :, ch[name]] = _bin_reduce(inc, bin_h, "sum")
        if name in LEVELS:
            bins[:, :, ch[f"{name}_level"]] = _bin_reduce(level, bin_h, "last")
    # peer comparison: a GPU replaying alone points at its own link, a whole node replaying at a shared cable
    bins[:, :, ch["pcie_vs_node"]] = _node_relative(bins[:, :, ch["pcie_replay"]], node)
    bins[:, :, ch["alive_h"]] = _bin_reduce(alive.astype(np.float32), bin_h, "sum")
    alive_end = alive[:, bin_h - 1 : nb * bin_h : bin_h]
    del alive
    reasons = _dense(frame, REASONS, flat, gpus, hours, dtype=np.int64)
    bins[:, :, ch["hw_throttle_h"]] = _bin_reduce(((reasons & _HW_BITS) != 0).astype(np.float32), bin_h, "sum")
    bins[:, :, ch["sw_thermal_h"]] = _bin_reduce(((reasons & _SW_THERMAL) != 0).astype(np.float32), bin_h, "sum")
    del reasons

    codes = _dense(frame, XID, flat, gpus, hours, dtype=np.int64)
    severity = np.vectorize(xid_catalog.severity, otypes=[object])
    classes = {int(c): severity(int(c)) for c in np.unique(codes) if c}
    hard = np.isin(codes, [c for c, s in classes.items() if s == "hard"])
    for name, mask in (
        ("xid63", codes == 63),
        ("xid92", codes == 92),
        ("xid94", codes == 94),
        ("xid_benign", np.isin(codes, [c for c, s in classes.items() if s == "benign"])),
        (
            "xid_other",
            np.isin(codes, [c for c, s in classes.items() if s not in ("benign", "hard") and c not in (63, 92, 94)]),
        ),
        ("xid_hard", hard),
    ):
        bins[:, :, ch[name]] = _bin_reduce(mask.astype(np.float32), bin_h, "sum")
    fg, fh = np.nonzero(hard)
    no_data = bins[:, :, ch["alive_h"]] == 0
    bins[no_data] = np.nan
    bins[:, :, ch["alive_h"]] = np.where(no_data, 0.0, bins[:, :, ch["alive_h"]])
    return FleetArrays(
        bins=bins,
        bin_h=bin_h,
        hours=hours,
        start=start,
        node=node,
        failure_gpu=fg.astype(np.int64),
        failure_hour=fh.astype(np.int64),
        failure_xid=codes[fg, fh].astype(np.int64),
        alive_end=alive_end,
    )
