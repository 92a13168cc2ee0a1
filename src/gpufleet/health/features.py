"""Prediction instances over sliding windows: which (GPU, time) to score, their labels and features.

An instance at time ``t`` (a bin boundary) sees the observation window ``[t - window, t)`` and is labelled
positive when the GPU fails (a hard XID) in ``[t, t + horizon)``. Several instances before each failure
are positive, the paper's sliding-window augmentation of scarce positives. Tabular features are window
aggregates of each channel (mean or sum over the window and its last day, last bin, maximum, spread,
bins since the last non-zero count); the sequence is the window's bins themselves, oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufleet.errors import HealthError
from gpufleet.health.fleet_arrays import COUNTERS, FleetArrays
from gpufleet.health.samples import Samples

_EVENTS = {*COUNTERS, "hw_throttle_h", "sw_thermal_h", "xid63", "xid92", "xid94", "xid_benign", "xid_other", "xid_hard"}


@dataclass(frozen=True)
class FeatureConfig:
    """Windows in hours: the observation window, its recent part, and the prediction horizon."""

    window_h: int = 168
    recent_h: int = 24
    horizon_h: int = 48

    def validate(self, bin_h: int) -> None:
        for name in ("window_h", "recent_h", "horizon_h"):
            value = getattr(self, name)
            if value <= 0 or value % bin_h:
                raise HealthError(f"{name}={value} must be a positive multiple of the {bin_h}-hour bin")
        if self.recent_h > self.window_h:
            raise HealthError(f"recent_h={self.recent_h} exceeds window_h={self.window_h}")


def _kinds(channels: tuple[str, ...]) -> list[str]:
    return ["alive" if ch == "alive_h" else "event" if ch in _EVENTS else "gauge" for ch in channels]


_STATS = {
    "event": ("sum_w", "sum_recent", "last", "max", "trend", "bins_since"),
    "gauge": ("mean_w", "mean_recent", "last", "max", "std_w", "trend"),
    "alive": ("frac_w",),
}


def feature_names(channels: tuple[str, ...]) -> list[str]:
    """Names of the tabular features, in column order."""
    return [f"{ch}_{stat}" for ch, kind in zip(channels, _kinds(channels), strict=True) for stat in _STATS[kind]]


def tabular_from_sequence(seq: np.ndarray, channels: tuple[str, ...], recent_bins: int, bin_h: int) -> np.ndarray:
    """Window aggregates of each channel from the (n, bins, channels) sequence, all channels at once.

    Each instance's features depend on its own sequence only (``bin_h`` scales the alive-hours share).
    """
    _n, wb, _ = seq.shape
    kinds = np.array(_kinds(channels))
    ev = np.nonzero(kinds == "event")[0]
    ga = np.nonzero(kinds == "gauge")[0]
    missing = np.isnan(seq)
    z = np.where(missing, np.float32(0), seq)
    count = wb - missing.sum(axis=1, dtype=np.int32)
    recent_count = recent_bins - missing[:, -recent_bins:].sum(axis=1, dtype=np.int32)
    total = z.sum(axis=1)
    recent = z[:, -recent_bins:].sum(axis=1)
    first_half = z[:, : wb // 2].sum(axis=1)
    peak = np.fmax.reduce(seq, axis=1)  # NaN-ignoring maximum
    with np.errstate(all="ignore"):
        mean_w = total / count
        mean_recent = recent / recent_count
        # centred sums: E[x^2] - mean^2 in float32 loses the spread of gauges far from zero (clocks ~2,000 MHz)
        centred = np.where(missing[:, :, ga], np.float32(0), seq[:, :, ga] - mean_w[:, None, ga])
        std_g = np.sqrt(np.einsum("nbc,nbc->nc", centred, centred, dtype=np.float64) / count[:, ga])
    nonzero = z[:, ::-1, ev] > 0
    since_e = np.where(nonzero.any(axis=1), np.argmax(nonzero, axis=1), wb).astype(np.float32)
    std = np.full_like(total, np.nan)
    std[:, ga] = std_g
    since = np.full_like(total, np.nan)
    since[:, ev] = since_e
    stats = {
        "sum_w": total,
        "sum_recent": recent,
        "max": peak,
        "trend": total - 2 * first_half,
        "bins_since": since,
        "mean_w": mean_w,
        "mean_recent": mean_recent,
        "std_w": std,
        "frac_w": total / (wb * bin_h),
    }
    last = seq[:, -1]
    cols = []
    for c, kind in enumerate(kinds):
        for stat in _STATS[kind]:
            if stat == "last":
                cols.append(np.nan_to_num(last[:, c]) if kind == "event" else last[:, c])
            elif kind == "gauge" and stat == "trend":
                cols.append(mean_recent[:, c] - mean_w[:, c])
            else:
                cols.append(stats[stat][:, c])
    return np.stack(cols, axis=1).astype(np.float32, copy=False)


def labels(arrays: FleetArrays, gpu: np.ndarray, hour: np.ndarray, horizon_h: int) -> tuple[np.ndarray, np.ndarray]:
    """1 where the GPU fails in ``[hour, hour + horizon)``, and the hours until that failure (NaN if none)."""
    if len(arrays.failure_gpu) == 0:
        return np.zeros(len(gpu), dtype=np.int8), np.full(len(gpu), np.nan, dtype=np.float32)
    key_f = arrays.failure_gpu * (arrays.hours + 1) + arrays.failure_hour
    order = np.argsort(key_f)
    key_f = key_f[order]
    key = gpu.astype(np.int64) * (arrays.hours + 1) + hour
    pos = np.searchsorted(key_f, key, side="left")
    nxt = np.where(pos < len(key_f), key_f[np.minimum(pos, len(key_f) - 1)], -1)
    same_gpu = (pos < len(key_f)) & (nxt // (arrays.hours + 1) == gpu)
    lead = np.where(same_gpu, (nxt % (arrays.hours + 1)) - hour, np.nan).astype(np.float32)
    y = (same_gpu & (lead < horizon_h)).astype(np.int8)
    return y, np.where(y == 1, lead, np.nan).astype(np.float32)


def candidate_instances(
    arrays: FleetArrays, cfg: FeatureConfig, start_h: int, end_h: int, every_h: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(gpu, hour) of every instance at bin boundaries in ``[start_h, end_h)`` whose GPU is up at that time.

    ``every_h`` thins the times (e.g. 24 for one prediction round a day); instances need a full window.
    """
    cfg.validate(arrays.bin_h)
    step = every_h or arrays.bin_h
    if step % arrays.bin_h:
        raise HealthError(f"prediction interval {step} h is not a multiple of the {arrays.bin_h}-hour bin")
    first = max(start_h, cfg.window_h)
    first = -(-first // step) * step
    last = min(end_h, arrays.n_bins * arrays.bin_h + 1)  # an instance at the very end reads only earlier bins
    times = np.arange(first, last, step, dtype=np.int64)
    if len(times) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    up = arrays.alive_end[:, times // arrays.bin_h - 1]  # reported in the hour before the prediction time
    g, t = np.nonzero(up)
    return g.astype(np.int64), times[t]


def build_samples(
    arrays: FleetArrays,
    gpu: np.ndarray,
    hour: np.ndarray,
    cfg: FeatureConfig,
    with_labels: bool = True,
    block: int = 50_000,
) -> Samples:
    """Features (and labels) of the given instances, gathered in blocks to bound memory."""
    wb, rb = cfg.window_h // arrays.bin_h, cfg.recent_h // arrays.bin_h
    offsets = np.arange(-wb, 0)
    flat = arrays.bins.reshape(-1, arrays.bins.shape[2])
    tabs, seqs = [], []
    for s in range(0, len(gpu), block):
        g, b = gpu[s : s + block], hour[s : s + block] // arrays.bin_h
        rows = (g * arrays.n_bins + b)[:, None] + offsets[None, :]
        seq = np.take(flat, rows, axis=0)
        seqs.append(seq)
        tabs.append(tabular_from_sequence(seq, arrays.channels, rb, arrays.bin_h))
    nf = len(feature_names(arrays.channels))
    tabular = np.concatenate(tabs) if tabs else np.zeros((0, nf), dtype=np.float32)
    sequence = np.concatenate(seqs) if seqs else np.zeros((0, wb, len(arrays.channels)), dtype=np.float32)
    y = lead = None
    if with_labels:
        y, lead = labels(arrays, gpu, hour, cfg.horizon_h)
    return Samples(
        gpu=gpu.astype(np.uint32),
        time=hour.astype(np.int64),
        tabular=tabular,
        sequence=sequence,
        y=y,
        feature_names=feature_names(arrays.channels),
        channel_names=list(arrays.channels),
        lead_h=lead,
    )


def training_samples(
    arrays: FleetArrays, cfg: FeatureConfig, start_h: int, end_h: int, negative_rate: float = 0.03, seed: int = 0
) -> Samples:
    """Labelled instances of ``[start_h, end_h)`` whose labels are known by ``end_h``: every positive and a
    random ``negative_rate`` of the negatives (failures are scarce; the paper augments positives likewise)."""
    gpu, hour = candidate_instances(arrays, cfg, start_h, end_h - cfg.horizon_h)
    y, _ = labels(arrays, gpu, hour, cfg.horizon_h)
    rng = np.random.default_rng(seed)
    keep = (y == 1) | (rng.random(len(y)) < negative_rate)
    return build_samples(arrays, gpu[keep], hour[keep], cfg)
