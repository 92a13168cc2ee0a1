"""The ``genai`` source: :func:`genai_load`, the shape of a real serving workload: the Alibaba GenAI (Stable
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
"""

from __future__ import annotations

import csv
import gzip
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpufleet.errors import TraceError
from gpufleet.traces.inference import register_source
from gpufleet.traces.inference.load import DAY_S, EPS, InferenceLoad, check_common, require

if TYPE_CHECKING:
    import polars as pl

MINUTES_PER_DAY = 1440
#: File name of the shipped busy-GPUs-per-minute profile inside ``gpufleet/data/inference``.
GENAI_PROFILE = "genai_busy_per_minute.csv.gz"
#: Columns of the raw GenAI request trace that :func:`derive_genai_profile` reads.
GENAI_RAW_COLUMNS = ("gmt_create", "exec_time_seconds")
#: Columns of the derived profile.
PROFILE_COLUMNS = ("minute", "busy_gpus")


def shipped_profile_path() -> Path:
    """Path of the busy-GPUs-per-minute profile shipped inside the package."""
    path = Path(str(resources.files("gpufleet").joinpath("data", "inference", GENAI_PROFILE)))
    if not path.is_file():
        raise TraceError(
            f"bundled inference profile {GENAI_PROFILE} is missing from the gpufleet install; "
            "reinstall gpufleet or pass path= the raw Alibaba GenAI request trace"
        )
    return path


def _busy_per_minute(raw_csv: Path) -> pl.DataFrame:
    """Steps 1-2 of the module docstring: the raw request trace -> busy GPUs per minute since its first midnight."""
    import polars as pl

    if not raw_csv.is_file():
        raise TraceError(
            f"GenAI request trace {raw_csv} not found; pass the path of "
            "lora_request_trace.csv (alibaba/clusterdata, cluster-trace-v2026-GenAI)"
        )
    try:
        header = pl.read_csv(raw_csv, n_rows=0).columns
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{raw_csv}: cannot read as CSV ({exc}); pass the GenAI request trace") from None
    missing = [c for c in GENAI_RAW_COLUMNS if c not in header]
    if missing:
        raise TraceError(
            f"{raw_csv}: line 1 (header) lacks column(s) {', '.join(missing)}; a GenAI request "
            f"trace needs {', '.join(GENAI_RAW_COLUMNS)} (found: {', '.join(header)})"
        )
    raw = pl.read_csv(raw_csv, columns=list(GENAI_RAW_COLUMNS), infer_schema=False).with_row_index("row")
    parsed = raw.with_columns(
        pl.col("gmt_create").str.strip_chars().str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False).alias("ts"),
        pl.col("exec_time_seconds").str.strip_chars().cast(pl.Float64, strict=False).alias("exec_s"),
    )
    bad_ts = parsed.filter(pl.col("ts").is_null())
    if bad_ts.height:
        row = bad_ts.row(0, named=True)
        raise TraceError(
            f"{raw_csv}, line {row['row'] + 2}: gmt_create {row['gmt_create']!r} is not a "
            f"'YYYY-MM-DD HH:MM:SS' time ({bad_ts.height} such rows); fix or delete those rows"
        )
    bad_exec = parsed.filter(
        pl.col("exec_s").is_null()
        & pl.col("exec_time_seconds").is_not_null()
        & (pl.col("exec_time_seconds").str.strip_chars() != "")
    )
    if bad_exec.height:
        row = bad_exec.row(0, named=True)
        raise TraceError(
            f"{raw_csv}, line {row['row'] + 2}: exec_time_seconds {row['exec_time_seconds']!r} is not "
            "a number; fix or delete that row"
        )
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
        raise TraceError(
            f"{path}: not a busy-GPU profile with columns minute,busy_gpus ({exc}); "
            "recreate it with derive_genai_profile"
        ) from None
    minute, busy = frame["minute"].to_numpy(), frame["busy_gpus"].to_numpy()
    if minute.size == 0 or np.any(np.diff(minute) != 1) or frame.null_count().sum_horizontal().item():
        raise TraceError(
            f"{path}: a busy-GPU profile needs one row per consecutive minute and no empty cells; "
            "recreate it with derive_genai_profile"
        )
    return minute, busy


def _genai_profile(path: str | Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """(minute, busy_gpus, source) from the shipped profile, a derived profile, or a raw request trace."""
    if path is None:
        profile = shipped_profile_path()
        return (*_read_profile(profile), str(profile))
    path = Path(path)
    if not path.is_file():
        raise TraceError(
            f"GenAI trace {path} not found; pass the raw lora_request_trace.csv, a profile made by "
            "derive_genai_profile, or no path for the shipped profile"
        )
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
        raise TraceError(
            f"{source}: the requests cover no whole day (midnight to midnight); genai_load needs at least one"
        )
    return busy[d0 * MINUTES_PER_DAY - first : d1 * MINUTES_PER_DAY - first]


@register_source("genai", order=0)
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
    check_common(pool_servers, until_s, step_s, where)
    require(
        not isinstance(gpus_per_server, bool)
        and isinstance(gpus_per_server, (int, np.integer))
        and gpus_per_server >= 1,
        f"{where}: gpus_per_server must be a whole number >= 1, got {gpus_per_server!r}",
    )
    require(
        math.isfinite(headroom) and headroom >= 0,
        f"{where}: headroom must be >= 0 (0.2 = 20 % spare), got {headroom!r}",
    )
    require(0 < peak_quantile <= 1, f"{where}: peak_quantile must lie in (0, 1], got {peak_quantile!r}")
    require(
        step_s % 60 == 0 and DAY_S % step_s == 0,
        f"{where}: step_s must be a multiple of 60 s that divides a day (60, 300, 900, 3600, ...), got {step_s!r}",
    )
    minute, busy, source = _genai_profile(path)
    days = _whole_days(minute, busy, source)
    windows = days.reshape(-1, int(step_s // 60)).mean(axis=1)
    peak = float(np.quantile(windows, peak_quantile))
    if peak <= 0:
        raise TraceError(f"{source}: the {peak_quantile} quantile of busy GPUs is 0; raise peak_quantile")
    gpus = windows * (pool_servers * gpus_per_server / peak) * (1.0 + headroom)
    tile = np.clip(np.ceil(gpus / gpus_per_server - EPS), 0, pool_servers).astype(np.int64)
    n = max(1, math.ceil(until_s / step_s))
    return InferenceLoad("genai", np.arange(n, dtype=np.float64) * step_s, np.resize(tile, n), pool_servers)
