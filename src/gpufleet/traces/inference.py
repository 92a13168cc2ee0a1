"""Inference load: how many inference servers the serving side needs over time, for capacity loaning (Aryl).

Aryl (Lyra, EuroSys'23) loans idle inference servers to training and takes them back when inference
traffic rises. The simulator needs that traffic as a piecewise-constant step function of *servers
needed*: :class:`InferenceLoad`. Every server of the inference pool that is not needed is idle and may
be loaned. Time 0 is the start of the job trace; times are seconds.

Four sources, chosen by name with :func:`load_inference` (CLI: ``gpufleet traces inference genai``):

``genai`` -- :func:`genai_load`, the shape of a real serving workload: the Alibaba GenAI (Stable
    Diffusion + LoRA) request trace, 26,823 requests from 2024-11-15 16:57:50 to 2024-12-08 17:33:57
    (``alibaba/clusterdata``, ``cluster-trace-v2026-GenAI/lora_request_trace.csv``). Steps:

    1. Each request occupies one GPU for ``exec_time_seconds`` from ``gmt_create``. Rows with a null
       or non-positive execution time are dropped (the 30 PENDING rows, all with 0 s); FAILED and
       PROCESSING rows that have an execution time are kept, since they occupied a GPU for it.
    2. Busy GPUs per minute = GPU-seconds of overlap with that minute / 60, computed with a
       difference array over minutes (no loop over requests). Minutes are counted from the first
       midnight of the trace's clock (2024-11-15 00:00). The trace's timestamps carry an anonymising
       offset (its README says so) whose size is not published, so "hour of day" below is the hour
       of the trace's clock, not necessarily local time.
    3. Only whole days that the trace covers are used: 2024-11-16 00:00 to 2024-12-08 00:00, 22
       days (the partial first and last days would read as idle hours).
    4. Busy GPUs are averaged over ``step_s`` windows (default 5 min).
    5. The trace is tiny (0.40 busy GPUs on average, 13.3 at the busiest minute), so only its shape
       is used: windows are scaled so that their ``peak_quantile`` (default 0.99) equals the pool's
       GPUs (``pool_servers * gpus_per_server``), i.e. the pool is sized for the 99th-percentile load.
    6. The service keeps ``headroom`` (default 20 %) spare capacity above its busy GPUs:
       GPUs needed = scaled busy GPUs x (1 + headroom). Headroom is applied after the scaling on
       purpose: applied before it, the scaling would cancel it exactly and the option would do
       nothing. The windows above the quantile, and those within the headroom below it, need more
       than the pool and are clipped to it.
    7. Servers needed = ceil(GPUs needed / gpus_per_server), clipped to [0, pool_servers].
    8. The 22-day tile is repeated to cover [0, until_s]; time 0 is midnight of the tile's first
       day, so ``t % 86400`` is the hour of day of the trace's clock on every repetition.

    With the defaults and 96 servers the mean utilisation is 13.9 % (22 days), the pool is full
    2.2 % of the time and below 40 % 86 % of the time (Aryl: inference utilisation "below 40 % for
    long periods"); the hour-of-day mean is 43 % at 00:00 and 23:00 and under 0.6 % from 09:00 to
    16:00. The load is bursty: the pool is sized for peaks that are rare.

    The wheel ships a derived copy (``gpufleet/data/inference/genai_busy_per_minute.csv.gz``: step 2's
    busy GPUs per minute, made by :func:`derive_genai_profile`), so nothing outside the package is
    read unless ``path=`` names a raw trace.

``diurnal`` -- :func:`diurnal_load`, a parametric cosine between a trough and a peak share of the
    pool, with multiplicative Gaussian noise.

``none`` -- no inference load: every server is always idle.

a CSV path -- :func:`read_load_csv`, any table with ``time`` (seconds) and ``servers_needed``.
"""

from __future__ import annotations

import csv
import gzip
import inspect
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufleet.errors import ConfigError, TraceError

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "GENAI_PROFILE",
    "InferenceLoad",
    "derive_genai_profile",
    "diurnal_load",
    "genai_load",
    "inference_sources",
    "load_inference",
    "read_load_csv",
]

DAY_S = 86400.0
MINUTES_PER_DAY = 1440
#: File name of the shipped busy-GPUs-per-minute profile inside ``gpufleet/data/inference``.
GENAI_PROFILE = "genai_busy_per_minute.csv.gz"
#: Columns of the raw GenAI request trace that :func:`derive_genai_profile` reads.
GENAI_RAW_COLUMNS = ("gmt_create", "exec_time_seconds")
#: Columns of the derived profile.
PROFILE_COLUMNS = ("minute", "busy_gpus")
#: Columns of a load CSV read by :func:`read_load_csv`.
LOAD_COLUMNS = ("time", "servers_needed")
#: A spacing between consecutive CSV times above this multiple of the median spacing is a gap.
GAP_FACTOR = 3.0
_NULLS = frozenset({"", "null", "none", "na", "n/a", "nan"})
_EPS = 1e-9  # rounding tolerance before ceil: 768.0000000001 GPUs must stay 96 servers


# ---------------------------------------------------------------------------------------------- the load
@dataclass(frozen=True, eq=False)
class InferenceLoad:
    """Servers the inference service needs over time.

    ``servers[i]`` holds from ``time_s[i]`` until ``time_s[i+1]`` (the last step holds forever); before
    ``time_s[0] == 0`` the first value holds. Arrays are stored read-only; construction checks the
    invariants (TraceError naming the broken one). Equality is identity (arrays do not compare as bools).
    """

    name: str
    time_s: np.ndarray  # float64, strictly increasing, time_s[0] == 0.0 (seconds since the job trace's start)
    servers: np.ndarray  # int64 >= 0
    pool_servers: int  # size of the inference pool it was made for (servers), servers <= pool_servers always

    def __post_init__(self) -> None:
        time = np.array(self.time_s, dtype=np.float64).ravel()
        servers = np.array(self.servers).ravel()
        where = f"inference load {self.name!r}"
        if time.size == 0 or time.size != servers.size:
            raise TraceError(f"{where}: time_s and servers need the same, non-zero length "
                             f"(got {time.size} and {servers.size})")
        if servers.dtype.kind == "f":
            if not np.all(np.isfinite(servers)) or np.any(servers != np.round(servers)):
                raise TraceError(f"{where}: servers must be whole numbers")
        elif servers.dtype.kind not in "iub":
            raise TraceError(f"{where}: servers must be whole numbers, got dtype {servers.dtype}")
        servers = servers.astype(np.int64)
        pool = self.pool_servers
        if isinstance(pool, bool) or not isinstance(pool, (int, np.integer)) or pool < 0:
            raise TraceError(f"{where}: pool_servers must be a whole number >= 0, got {self.pool_servers!r}")
        if not np.all(np.isfinite(time)) or time[0] != 0.0 or np.any(np.diff(time) <= 0):
            raise TraceError(f"{where}: time_s must be finite, start at 0.0 and strictly increase")
        if servers.min() < 0 or servers.max() > self.pool_servers:
            raise TraceError(f"{where}: servers must lie in [0, pool_servers={self.pool_servers}], "
                             f"got {servers.min()}..{servers.max()}")
        time.setflags(write=False)
        servers.setflags(write=False)
        object.__setattr__(self, "time_s", time)
        object.__setattr__(self, "servers", servers)
        object.__setattr__(self, "pool_servers", int(self.pool_servers))

    def __repr__(self) -> str:
        return (f"InferenceLoad(name={self.name!r}, steps={self.time_s.size}, pool_servers={self.pool_servers}, "
                f"last_step_s={self.time_s[-1]:g})")

    def _index(self, t: np.ndarray | float) -> np.ndarray:
        """Index of the step in force at ``t`` (0 before time 0)."""
        idx = np.searchsorted(self.time_s, t, side="right") - 1
        return np.maximum(idx, 0)

    def at(self, t: float) -> int:
        """Servers needed at time ``t``: the step that started at or before ``t`` (a step owns its start)."""
        return int(self.servers[self._index(t)])

    def idle_at(self, t: float) -> int:
        """Idle servers at time ``t``: ``pool_servers - at(t)``, the servers that may be loaned."""
        return self.pool_servers - self.at(t)

    def _integral(self, t: np.ndarray) -> np.ndarray:
        """Server-seconds needed from time 0 to each ``t`` (negative before 0, where the first value holds)."""
        widths = np.diff(self.time_s)
        cum = np.concatenate(([0.0], np.cumsum(widths * self.servers[:-1])))
        idx = self._index(t)
        return cum[idx] + self.servers[idx] * (t - self.time_s[idx])

    def mean_utilisation(self, start: float, end: float) -> float:
        """Time-weighted mean of servers needed / pool_servers over [start, end] (0.0 for an empty pool).

        ``start == end`` gives the utilisation at that instant; ``end < start`` is a ConfigError.
        """
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise ConfigError(f"mean_utilisation: need finite start <= end, got start={start}, end={end}")
        if self.pool_servers == 0:
            return 0.0
        if end == start:
            return self.at(start) / self.pool_servers
        g = self._integral(np.array([start, end], dtype=np.float64))
        return float((g[1] - g[0]) / (end - start) / self.pool_servers)

    def hourly_utilisation(self, start: float = 0.0, end: float | None = None) -> np.ndarray:
        """Mean utilisation for each hour of day 0..23 (``t % 86400``), time-weighted over [start, end].

        ``end`` defaults to :meth:`default_end`. Hours that [start, end] never reaches are NaN.
        """
        end = self.default_end() if end is None else end
        if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
            raise ConfigError(f"hourly_utilisation: need finite start < end, got start={start}, end={end}")
        first = math.floor(start / 3600.0)
        edges = np.arange(first, math.ceil(end / 3600.0) + 1, dtype=np.float64) * 3600.0
        edges = np.clip(edges, start, end)
        seconds = np.diff(edges)
        used = self._integral(edges)
        hours = (np.arange(first, first + seconds.size) % 24).astype(np.int64)
        total_s = np.bincount(hours, weights=seconds, minlength=24)
        total_used = np.bincount(hours, weights=np.diff(used), minlength=24)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = total_used / total_s / max(self.pool_servers, 1)
        return np.where(total_s > 0, share, np.nan)

    def default_end(self) -> float:
        """End of the period the load describes: last step + the median step width (1 day for one step)."""
        if self.time_s.size == 1:
            return DAY_S
        return float(self.time_s[-1] + np.median(np.diff(self.time_s)))

    def describe(self, start: float = 0.0, end: float | None = None) -> dict[str, Any]:
        """Summary over [start, end] (default: :meth:`default_end`): steps, utilisation, idle servers.

        Keys: name, pool_servers, start_s, end_s, steps (steps in force during the window), mean/peak/
        trough_utilisation, mean_servers_needed, mean_idle_servers, and hourly_utilisation (24 values).
        """
        end = self.default_end() if end is None else end
        if end <= start:
            raise ConfigError(f"describe: need start < end, got start={start}, end={end}")
        lo, hi = int(self._index(start)), int(np.searchsorted(self.time_s, end, side="left"))
        window = self.servers[lo:max(hi, lo + 1)]
        pool = max(self.pool_servers, 1)
        mean = self.mean_utilisation(start, end)
        return {
            "name": self.name,
            "pool_servers": self.pool_servers,
            "start_s": float(start),
            "end_s": float(end),
            "steps": int(window.size),
            "mean_utilisation": mean,
            "peak_utilisation": float(window.max() / pool) if self.pool_servers else 0.0,
            "trough_utilisation": float(window.min() / pool) if self.pool_servers else 0.0,
            "mean_servers_needed": mean * self.pool_servers,
            "mean_idle_servers": (1.0 - mean) * self.pool_servers,
            "hourly_utilisation": [round(float(v), 6) for v in self.hourly_utilisation(start, end)],
        }

    def to_frame(self) -> pl.DataFrame:
        """The steps as a frame: ``time_s`` (float64), ``servers_needed`` and ``idle_servers`` (int64)."""
        import polars as pl

        return pl.DataFrame({
            "time_s": self.time_s,
            "servers_needed": self.servers,
            "idle_servers": self.pool_servers - self.servers,
        })

    def merged(self) -> InferenceLoad:
        """The same load with fewer events: steps whose value equals the previous step's are dropped."""
        keep = np.concatenate(([True], self.servers[1:] != self.servers[:-1]))
        return InferenceLoad(self.name, self.time_s[keep], self.servers[keep], self.pool_servers)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_common(pool_servers: int, until_s: float, step_s: float, where: str) -> None:
    _require(not isinstance(pool_servers, bool) and isinstance(pool_servers, (int, np.integer)) and pool_servers >= 0,
             f"{where}: pool_servers must be a whole number >= 0 (servers in the inference pool), got {pool_servers!r}")
    _require(math.isfinite(until_s) and until_s > 0,
             f"{where}: until_s must be a positive number of seconds (the span to cover), got {until_s!r}")
    _require(math.isfinite(step_s) and step_s > 0, f"{where}: step_s must be a positive number of seconds, "
             f"got {step_s!r}")


# ---------------------------------------------------------------------------------------------- genai
def shipped_profile_path() -> Path:
    """Path of the busy-GPUs-per-minute profile shipped inside the package."""
    path = Path(str(resources.files("gpufleet").joinpath("data", "inference", GENAI_PROFILE)))
    if not path.is_file():
        raise TraceError(f"bundled inference profile {GENAI_PROFILE} is missing from the gpufleet install; "
                         "reinstall gpufleet or pass path= the raw Alibaba GenAI request trace")
    return path


def _busy_per_minute(raw_csv: Path) -> pl.DataFrame:
    """Steps 1-2 of the module docstring: the raw request trace -> busy GPUs per minute since its first midnight."""
    import polars as pl

    if not raw_csv.is_file():
        raise TraceError(f"GenAI request trace {raw_csv} not found; pass the path of "
                         "lora_request_trace.csv (alibaba/clusterdata, cluster-trace-v2026-GenAI)")
    try:
        header = pl.read_csv(raw_csv, n_rows=0).columns
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{raw_csv}: cannot read as CSV ({exc}); pass the GenAI request trace") from None
    missing = [c for c in GENAI_RAW_COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{raw_csv}: line 1 (header) lacks column(s) {', '.join(missing)}; a GenAI request "
                         f"trace needs {', '.join(GENAI_RAW_COLUMNS)} (found: {', '.join(header)})")
    raw = pl.read_csv(raw_csv, columns=list(GENAI_RAW_COLUMNS), infer_schema=False).with_row_index("row")
    parsed = raw.with_columns(
        pl.col("gmt_create").str.strip_chars().str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False).alias("ts"),
        pl.col("exec_time_seconds").str.strip_chars().cast(pl.Float64, strict=False).alias("exec_s"),
    )
    bad_ts = parsed.filter(pl.col("ts").is_null())
    if bad_ts.height:
        row = bad_ts.row(0, named=True)
        raise TraceError(f"{raw_csv}, line {row['row'] + 2}: gmt_create {row['gmt_create']!r} is not a "
                         f"'YYYY-MM-DD HH:MM:SS' time ({bad_ts.height} such rows); fix or delete those rows")
    bad_exec = parsed.filter(pl.col("exec_s").is_null() & pl.col("exec_time_seconds").is_not_null()
                             & (pl.col("exec_time_seconds").str.strip_chars() != ""))
    if bad_exec.height:
        row = bad_exec.row(0, named=True)
        raise TraceError(f"{raw_csv}, line {row['row'] + 2}: exec_time_seconds {row['exec_time_seconds']!r} is not "
                         "a number; fix or delete that row")
    # Step 1: a request holds one GPU for its execution time; null / <= 0 (PENDING) rows held none.
    used = parsed.filter(pl.col("exec_s").is_finite() & (pl.col("exec_s") > 0))
    if used.height == 0:
        raise TraceError(f"{raw_csv}: no request has a positive exec_time_seconds; nothing to derive a load from")
    origin = used["ts"].min().replace(hour=0, minute=0, second=0, microsecond=0)
    start = (used["ts"] - origin).dt.total_microseconds().to_numpy().astype(np.float64) / 1e6
    end = start + used["exec_s"].to_numpy()
    # Step 2: GPU-seconds per minute. A request's first and last minute get their partial overlap;
    # the minutes strictly between get 60 s each, through a difference array.
    m0 = np.floor(start / 60.0).astype(np.int64)
    m1 = np.floor(end / 60.0).astype(np.int64)
    m1 = np.where(end == m1 * 60.0, m1 - 1, m1)  # a request ending on a boundary does not touch the next minute
    m1 = np.maximum(m1, m0)
    n = int(m1.max()) + 1
    seconds = np.zeros(n, dtype=np.float64)
    one = m0 == m1
    np.add.at(seconds, m0[one], end[one] - start[one])
    many = ~one
    np.add.at(seconds, m0[many], (m0[many] + 1) * 60.0 - start[many])
    np.add.at(seconds, m1[many], end[many] - m1[many] * 60.0)
    full = np.zeros(n + 1, dtype=np.float64)
    np.add.at(full, m0[many] + 1, 60.0)
    np.add.at(full, m1[many], -60.0)
    seconds += np.cumsum(full)[:n]
    first = int(m0.min())
    busy = np.round(seconds[first:] / 60.0, 4)
    return pl.DataFrame({"minute": np.arange(first, n, dtype=np.int64), "busy_gpus": busy})


def derive_genai_profile(raw_csv: str | Path, out_path: str | Path) -> Path:
    """Write the compact busy-GPUs-per-minute profile that ``genai_load`` reads, from the raw GenAI trace.

    ``out_path`` gets a gzip CSV with ``minute`` (minutes since the first midnight of the trace's clock,
    one row for every minute from the first request's to the last request's end) and ``busy_gpus``
    (GPU-seconds of overlap / 60, rounded to 4 decimals). The gzip header carries no name or time, so
    the same input always gives the same bytes. Returns ``out_path``.
    """
    frame = _busy_per_minute(Path(raw_csv))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = frame.write_csv(float_precision=4)
    with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode())
    return out


def _read_profile(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(minute, busy_gpus) from a derived profile, checked to be one row per consecutive minute."""
    import polars as pl

    try:
        frame = pl.read_csv(path, schema={"minute": pl.Int64, "busy_gpus": pl.Float64})
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise TraceError(f"{path}: not a busy-GPU profile with columns minute,busy_gpus ({exc}); "
                         "recreate it with derive_genai_profile") from None
    minute, busy = frame["minute"].to_numpy(), frame["busy_gpus"].to_numpy()
    if minute.size == 0 or np.any(np.diff(minute) != 1) or frame.null_count().sum_horizontal().item():
        raise TraceError(f"{path}: a busy-GPU profile needs one row per consecutive minute and no empty cells; "
                         "recreate it with derive_genai_profile")
    return minute, busy


def _genai_profile(path: str | Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """(minute, busy_gpus, source) from the shipped profile, a derived profile, or a raw request trace."""
    if path is None:
        profile = shipped_profile_path()
        return (*_read_profile(profile), str(profile))
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"GenAI trace {path} not found; pass the raw lora_request_trace.csv, a profile made by "
                         "derive_genai_profile, or no path for the shipped profile")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        header = tuple(next(csv.reader(fh), []))
    if header == PROFILE_COLUMNS:
        return (*_read_profile(path), str(path))
    frame = _busy_per_minute(path)
    return frame["minute"].to_numpy(), frame["busy_gpus"].to_numpy(), str(path)


def _whole_days(minute: np.ndarray, busy: np.ndarray, source: str) -> np.ndarray:
    """Step 3: busy GPUs of the whole days the profile covers, from the first midnight after its start."""
    first, stop = int(minute[0]), int(minute[-1]) + 1
    d0, d1 = -(-first // MINUTES_PER_DAY), stop // MINUTES_PER_DAY
    if d1 <= d0:
        raise TraceError(f"{source}: the requests cover no whole day (midnight to midnight); "
                         "genai_load needs at least one")
    return busy[d0 * MINUTES_PER_DAY - first:d1 * MINUTES_PER_DAY - first]


def genai_load(
    pool_servers: int,
    *,
    until_s: float,
    path: str | Path | None = None,
    gpus_per_server: int = 8,
    headroom: float = 0.2,
    step_s: float = 300.0,
    peak_quantile: float = 0.99,
) -> InferenceLoad:
    """Servers needed by a serving workload shaped like the Alibaba GenAI request trace, tiled over [0, until_s].

    Steps (see the module docstring for the data): (1) each request holds one GPU for its execution
    time, rows without a positive execution time are dropped and FAILED rows with one are kept;
    (2) busy GPUs per minute from the GPU-seconds of overlap; (3) the whole days of the trace (22);
    (4) the mean over ``step_s`` windows (a multiple of 60 s that divides a day); (5) scaled so that
    the ``peak_quantile`` of the windows equals ``pool_servers * gpus_per_server`` GPUs; (6) times
    ``1 + headroom`` spare capacity (after the scaling, else the scaling would cancel it); (7) ceil
    to whole servers, clipped to [0, pool_servers]; (8) the day-aligned tile repeated from time 0
    (= midnight of the trace's clock) until ``until_s``.

    ``path=None`` reads the profile shipped in the wheel; ``path`` may name the raw
    ``lora_request_trace.csv`` (re-derived, same result) or a profile written by
    :func:`derive_genai_profile`. Bad arguments raise ConfigError, bad files TraceError.
    """
    where = "genai_load"
    _check_common(pool_servers, until_s, step_s, where)
    _require(not isinstance(gpus_per_server, bool) and isinstance(gpus_per_server, (int, np.integer))
             and gpus_per_server >= 1, f"{where}: gpus_per_server must be a whole number >= 1, got {gpus_per_server!r}")
    _require(math.isfinite(headroom) and headroom >= 0, f"{where}: headroom must be >= 0 (0.2 = 20 % spare), "
             f"got {headroom!r}")
    _require(0 < peak_quantile <= 1, f"{where}: peak_quantile must lie in (0, 1], got {peak_quantile!r}")
    _require(step_s % 60 == 0 and DAY_S % step_s == 0,
             f"{where}: step_s must be a multiple of 60 s that divides a day (60, 300, 900, 3600, ...), got {step_s!r}")
    minute, busy, source = _genai_profile(path)
    days = _whole_days(minute, busy, source)
    windows = days.reshape(-1, int(step_s // 60)).mean(axis=1)
    peak = float(np.quantile(windows, peak_quantile))
    if peak <= 0:
        raise TraceError(f"{source}: the {peak_quantile} quantile of busy GPUs is 0; raise peak_quantile")
    gpus = windows * (pool_servers * gpus_per_server / peak) * (1.0 + headroom)
    tile = np.clip(np.ceil(gpus / gpus_per_server - _EPS), 0, pool_servers).astype(np.int64)
    n = max(1, math.ceil(until_s / step_s))
    return InferenceLoad("genai", np.arange(n, dtype=np.float64) * step_s, np.resize(tile, n), pool_servers)


# ---------------------------------------------------------------------------------------------- diurnal
def diurnal_load(
    pool_servers: int,
    *,
    until_s: float,
    peak: float = 0.9,
    trough: float = 0.2,
    period_s: float = 86400.0,
    peak_hour: float = 14.0,
    step_s: float = 300.0,
    noise: float = 0.05,
    seed: int = 0,
) -> InferenceLoad:
    """A cosine day: servers needed swing between ``trough`` and ``peak`` shares of the pool.

    At the start of each ``step_s`` step, share = trough + (peak - trough) * (1 + cos(2 pi (t - peak_hour
    * 3600) / period_s)) / 2, times (1 + noise * N(0, 1)) drawn with ``np.random.default_rng(seed)``;
    servers = ceil(share * pool_servers), clipped to [0, pool_servers]. The mean utilisation is about
    (peak + trough) / 2 plus half a server of rounding. ConfigError for 0 <= trough <= peak <= 1,
    period_s > 0, 0 <= peak_hour < period_s / 3600, step_s > 0, noise >= 0 broken.
    """
    where = "diurnal_load"
    _check_common(pool_servers, until_s, step_s, where)
    _require(0 <= trough <= peak <= 1, f"{where}: need 0 <= trough <= peak <= 1 (shares of the pool), "
             f"got trough={trough!r}, peak={peak!r}")
    _require(math.isfinite(period_s) and period_s > 0, f"{where}: period_s must be positive seconds, got {period_s!r}")
    _require(math.isfinite(peak_hour) and 0 <= peak_hour * 3600.0 < period_s,
             f"{where}: peak_hour must lie in [0, period_s / 3600 = {period_s / 3600:g}), got {peak_hour!r}")
    _require(math.isfinite(noise) and noise >= 0, f"{where}: noise must be >= 0 (0.05 = 5 % sd), got {noise!r}")
    n = max(1, math.ceil(until_s / step_s))
    time = np.arange(n, dtype=np.float64) * step_s
    share = trough + (peak - trough) * 0.5 * (1.0 + np.cos(2.0 * np.pi * (time - peak_hour * 3600.0) / period_s))
    if noise > 0:
        share = share * (1.0 + noise * np.random.default_rng(seed).standard_normal(n))
    servers = np.clip(np.ceil(share * pool_servers - _EPS), 0, pool_servers).astype(np.int64)
    return InferenceLoad("diurnal", time, servers, pool_servers)


# ---------------------------------------------------------------------------------------------- CSV
def _read_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (line number, cells) of every non-blank row; line 1 is the header."""
    if not path.is_file():
        raise TraceError(f"inference load {path} not found; pass a CSV with columns time,servers_needed, "
                         "or one of: " + ", ".join(inference_sources()))
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", newline="", encoding="utf-8-sig") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read as a UTF-8 CSV ({exc})") from None
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    for cells in reader:
        if not any(c.strip() for c in cells):
            continue
        if header is None:
            header = [c.strip() for c in cells]
        else:
            rows.append((reader.line_num, cells))
    if header is None:
        raise TraceError(f"{path}: the file is empty; write a header line 'time,servers_needed' and one row per step")
    return header, rows


def _number(path: Path, line: int, column: str, cell: str) -> float:
    if cell.strip().lower() in _NULLS:
        raise TraceError(f"{path}, line {line}: empty {column!r} cell ({cell.strip() or 'blank'}); "
                         "give every row a time and a servers_needed value")
    try:
        value = float(cell)
    except ValueError:
        raise TraceError(f"{path}, line {line}: {column} {cell.strip()!r} is not a number; "
                         f"write {column} as a plain number") from None
    if not math.isfinite(value):
        raise TraceError(f"{path}, line {line}: {column} {cell.strip()!r} is not finite; write a finite number")
    return value


def read_load_csv(path: str | Path, *, pool_servers: int | None = None) -> InferenceLoad:
    """Read a load from a CSV with columns ``time`` (seconds since the job trace's start) and ``servers_needed``.

    Each row's count holds from its time until the next row's; the last holds forever. If the first
    time is after 0, the first count is taken to hold from 0 as well. Other columns are ignored;
    ``.csv.gz`` is read too. ``pool_servers`` None takes the largest count as the pool.

    Every problem is a TraceError naming the file, the line (1-based; the header is line 1) and the
    fix: a missing column, an empty or null cell, a non-numeric or non-finite value, a negative time,
    a negative or fractional count, a count above ``pool_servers``, a time not after the one before
    it (unsorted or duplicate), and a gap -- consecutive times further apart than 3x the median spacing.
    """
    path = Path(path)
    header, rows = _read_rows(path)
    missing = [c for c in LOAD_COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{path}, line 1: header lacks column(s) {', '.join(missing)} (found: {', '.join(header)}); "
                         "name the columns 'time' (seconds) and 'servers_needed' (servers)")
    if not rows:
        raise TraceError(f"{path}: no rows after the header; add one row per step: time,servers_needed")
    ti, si = header.index("time"), header.index("servers_needed")
    lines = np.empty(len(rows), dtype=np.int64)
    time = np.empty(len(rows), dtype=np.float64)
    servers = np.empty(len(rows), dtype=np.int64)
    for k, (line, cells) in enumerate(rows):
        t = _number(path, line, "time", cells[ti] if ti < len(cells) else "")
        s = _number(path, line, "servers_needed", cells[si] if si < len(cells) else "")
        if t < 0:
            raise TraceError(f"{path}, line {line}: time {t:g} is negative; times are seconds since the job "
                             "trace's start (>= 0)")
        if s < 0 or s != round(s):
            raise TraceError(f"{path}, line {line}: servers_needed {cells[si].strip()} is not a whole number >= 0; "
                             "write a count of servers")
        lines[k], time[k], servers[k] = line, t, int(s)
    step = np.diff(time)
    bad = np.flatnonzero(step <= 0)
    if bad.size:
        k = int(bad[0])
        what = "repeats" if step[k] == 0 else "is before"
        raise TraceError(f"{path}, line {lines[k + 1]}: time {time[k + 1]:g} {what} time {time[k]:g} of line "
                         f"{lines[k]}; sort the rows by time and keep one row per time")
    if step.size >= 2:
        median = float(np.median(step))
        gaps = np.flatnonzero(step > GAP_FACTOR * median)
        if gaps.size:
            k = int(gaps[0])
            raise TraceError(f"{path}, lines {lines[k]}-{lines[k + 1]}: gap from time {time[k]:g} to {time[k + 1]:g} "
                             f"({step[k]:g} s, over {GAP_FACTOR:g}x the median spacing of {median:g} s); "
                             "add the missing rows")
    if pool_servers is None:
        pool_servers = int(servers.max())
    elif isinstance(pool_servers, bool) or not isinstance(pool_servers, (int, np.integer)) or pool_servers < 0:
        raise ConfigError(f"read_load_csv: pool_servers must be a whole number >= 0, got {pool_servers!r}")
    over = np.flatnonzero(servers > pool_servers)
    if over.size:
        k = int(over[0])
        raise TraceError(f"{path}, line {lines[k]}: servers_needed {servers[k]} exceeds the pool of {pool_servers} "
                         "servers; enlarge the inference pool or scale the counts down")
    if time[0] > 0:  # the first count also holds before the first row
        time, servers = np.concatenate(([0.0], time)), np.concatenate((servers[:1], servers))
    return InferenceLoad(path.name.removesuffix(".gz").removesuffix(".csv"), time, servers, pool_servers)


# ---------------------------------------------------------------------------------------------- resolver
def _no_load(pool_servers: int, *, until_s: float) -> InferenceLoad:
    """No inference traffic: all servers idle all the time."""
    _check_common(pool_servers, until_s, 1.0, "load_inference('none')")
    return InferenceLoad("none", np.zeros(1), np.zeros(1, dtype=np.int64), pool_servers)


_SOURCES: dict[str, Callable[..., InferenceLoad]] = {
    "genai": genai_load,
    "diurnal": diurnal_load,
    "none": _no_load,
}


def inference_sources() -> list[str]:
    """Names ``load_inference`` accepts besides a CSV path."""
    return list(_SOURCES)


def _check_opts(source: str, func: Callable[..., Any], opts: dict[str, Any], skip: set[str]) -> None:
    accepted = [p for p in inspect.signature(func).parameters if p not in skip]
    unknown = sorted(set(opts) - set(accepted))
    if unknown:
        raise ConfigError(f"inference load {source!r} takes no option(s) {', '.join(unknown)}; "
                          f"its options are: {', '.join(accepted) or 'none'}")


def load_inference(source: str, *, pool_servers: int, until_s: float, **opts: Any) -> InferenceLoad:
    """The inference load named by ``source``: "genai", "diurnal", "none", or the path of a load CSV.

    ``opts`` go to the source's function (e.g. ``headroom=0.3`` for genai, ``peak=0.8`` for diurnal);
    an option it does not take is a ConfigError. A CSV takes no options and keeps its own time span
    (its last count holds forever); its counts must fit ``pool_servers``. A name that is neither a
    source nor an existing file is a TraceError listing the choices.
    """
    key = str(source).strip()
    func = _SOURCES.get(key.lower())
    if func is not None:
        _check_opts(key, func, opts, {"pool_servers", "until_s"})
        return func(pool_servers, until_s=until_s, **opts)
    path = Path(key).expanduser()
    if not path.is_file():
        raise TraceError(f"unknown inference load {key!r}: not one of {', '.join(inference_sources())} "
                         "and not an existing CSV file (columns time,servers_needed)")
    _check_opts(key, read_load_csv, opts, {"path", "pool_servers"})
    return read_load_csv(path, pool_servers=pool_servers)
