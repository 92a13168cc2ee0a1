"""A load from a CSV file (``time``, ``servers_needed``): what ``load_inference`` reads for a path."""

from __future__ import annotations

import csv
import gzip
import io
import math
from pathlib import Path

import numpy as np

from gpufleet.errors import ConfigError, TraceError
from gpufleet.traces.inference import inference_sources
from gpufleet.traces.inference.load import InferenceLoad

#: Columns of a load CSV read by :func:`read_load_csv`.
LOAD_COLUMNS = ("time", "servers_needed")
#: A spacing between consecutive CSV times above this multiple of the median spacing is a gap.
GAP_FACTOR = 3.0
_NULLS = frozenset({"", "null", "none", "na", "n/a", "nan"})


def _read_rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (line number, cells) of every non-blank row; line 1 is the header."""
    if not path.is_file():
        raise TraceError(
            f"inference load {path} not found; pass a CSV with columns time,servers_needed, "
            "or one of: " + ", ".join(inference_sources())
        )
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
        raise TraceError(
            f"{path}, line {line}: empty {column!r} cell ({cell.strip() or 'blank'}); "
            "give every row a time and a servers_needed value"
        )
    try:
        value = float(cell)
    except ValueError:
        raise TraceError(
            f"{path}, line {line}: {column} {cell.strip()!r} is not a number; write {column} as a plain number"
        ) from None
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
        raise TraceError(
            f"{path}, line 1: header lacks column(s) {', '.join(missing)} (found: {', '.join(header)}); "
            "name the columns 'time' (seconds) and 'servers_needed' (servers)"
        )
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
            raise TraceError(
                f"{path}, line {line}: time {t:g} is negative; times are seconds since the job trace's start (>= 0)"
            )
        if s < 0 or s != round(s):
            raise TraceError(
                f"{path}, line {line}: servers_needed {cells[si].strip()} is not a whole number >= 0; "
                "write a count of servers"
            )
        lines[k], time[k], servers[k] = line, t, int(s)
    step = np.diff(time)
    bad = np.flatnonzero(step <= 0)
    if bad.size:
        k = int(bad[0])
        what = "repeats" if step[k] == 0 else "is before"
        raise TraceError(
            f"{path}, line {lines[k + 1]}: time {time[k + 1]:g} {what} time {time[k]:g} of line "
            f"{lines[k]}; sort the rows by time and keep one row per time"
        )
    if step.size >= 2:
        median = float(np.median(step))
        gaps = np.flatnonzero(step > GAP_FACTOR * median)
        if gaps.size:
            k = int(gaps[0])
            raise TraceError(
                f"{path}, lines {lines[k]}-{lines[k + 1]}: gap from time {time[k]:g} to {time[k + 1]:g} "
                f"({step[k]:g} s, over {GAP_FACTOR:g}x the median spacing of {median:g} s); "
                "add the missing rows"
            )
    if pool_servers is None:
        pool_servers = int(servers.max())
    elif isinstance(pool_servers, bool) or not isinstance(pool_servers, (int, np.integer)) or pool_servers < 0:
        raise ConfigError(f"read_load_csv: pool_servers must be a whole number >= 0, got {pool_servers!r}")
    over = np.flatnonzero(servers > pool_servers)
    if over.size:
        k = int(over[0])
        raise TraceError(
            f"{path}, line {lines[k]}: servers_needed {servers[k]} exceeds the pool of {pool_servers} "
            "servers; enlarge the inference pool or scale the counts down"
        )
    if time[0] > 0:  # the first count also holds before the first row
        time, servers = np.concatenate(([0.0], time)), np.concatenate((servers[:1], servers))
    return InferenceLoad(path.name.removesuffix(".gz").removesuffix(".csv"), time, servers, pool_servers)
