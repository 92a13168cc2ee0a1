"""Reader of PyTorch profiler (Kineto) Chrome-trace files into columnar Polars frames.

One file per rank, ``.json`` or ``.json.gz``. Complete events (``ph == "X"``) and instant events become one
row each, with times in integer nanoseconds so that sums and joins are exact; flow events (``s``/``f``,
categories ``ac2g``, ``async_cpu_to_gpu``, ``fwdbwd``) go to a separate frame. The rank comes from
``distributedInfo.rank``, else from the file name (``rank-3``, ``rank3``, ``worker3``), else from the
file's position in the folder. A truncated or malformed file raises :class:`DiagnoseError` naming the file
and the byte offset where reading stopped.
"""

from __future__ import annotations

import gc
import io
import os
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from gpufleet.errors import DiagnoseError

__all__ = [
    "TRACE_SUFFIXES",
    "NotATraceError",
    "TraceFile",
    "TraceSet",
    "find_trace_files",
    "load_bytes",
    "read_folder",
    "read_trace",
]

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)
_FLOW_PHASES = {"s", "f", "t"}

#: Event columns and their Polars types; every trace frame has exactly these, in this order.
EVENT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "ph": pl.Utf8(),
    "cat": pl.Utf8(),
    "name": pl.Utf8(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "ts_ns": pl.Int64(),
    "dur_ns": pl.Int64(),
    "external_id": pl.Int64(),
    "correlation": pl.Int64(),
    "stream": pl.Int64(),
    "device": pl.Int64(),
    "collective": pl.Utf8(),
    "in_nelems": pl.Int64(),
    "out_nelems": pl.Int64(),
    "group_size": pl.Int64(),
    "dtype": pl.Utf8(),
    "pg_name": pl.Utf8(),
    "bytes": pl.Int64(),
    "python_id": pl.Int64(),
    "python_parent_id": pl.Int64(),
}

# args key -> event column, for the integer- and string-valued metadata we keep.
_INT_ARGS = {
    "external_id": "External id",
    "correlation": "correlation",
    "stream": "stream",
    "device": "device",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "bytes": "bytes",
    "python_id": "Python id",
    "python_parent_id": "Python parent id",
}
_STR_ARGS = {"collective": "Collective name", "dtype": "dtype", "pg_name": "Process Group Name"}

FLOW_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "ph": pl.Utf8(),
    "cat": pl.Utf8(),
    "id": pl.Int64(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "ts_ns": pl.Int64(),
}


class NotATraceError(DiagnoseError):
    """A JSON file that is valid but holds no ``traceEvents``: skipped inside a folder, an error on its own."""


@dataclass
class TraceFile:
    """One rank's trace: its events, flows and its ``distributedInfo`` (rank, world size) when it has one."""

    path: Path
    rank: int
    rank_source: str  # "distributedInfo", "file name" or "position"
    world_size: int | None
    events: pl.DataFrame
    flows: pl.DataFrame
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceSet:
    """The traces of one job: all ranks' events in one frame, plus what is known to be missing."""

    files: list[TraceFile]
    events: pl.DataFrame
    flows: pl.DataFrame
    world_size: int | None
    missing_ranks: list[int]
    skipped: list[Path] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        """The ranks present, sorted."""
        return sorted(f.rank for f in self.files)


def load_bytes(path: Path) -> bytes:
    """The decompressed bytes of a trace; a truncated gzip stream raises with the compressed offset reached."""
    raw = path.read_bytes()
    if not path.name.endswith(".gz"):
        return raw
    out: list[bytes] = []
    pos = 0
    while pos < len(raw):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out.append(inflater.decompress(raw[pos:]))
        except zlib.error as exc:
            raise DiagnoseError(f"{path}: corrupt gzip data near byte {pos} ({exc}); the file is damaged") from None
        if not inflater.eof:
            done = len(raw) - pos - len(inflater.unconsumed_tail)
            raise DiagnoseError(
                f"{path}: gzip stream truncated at byte {pos + done} of {len(raw)} (after "
                f"{sum(map(len, out))} bytes of JSON); the trace was cut off while being written"
            )
        pos = len(raw) - len(inflater.unused_data)
        if inflater.unused_data.strip(b"\x00") == b"":
            break
    return b"".join(out)


def _parse_json(path: Path, data: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        what = "ends early" if exc.pos >= len(data.rstrip()) - 1 else "is malformed"
        raise DiagnoseError(
            f"{path}: trace JSON {what} at offset {exc.pos} of {len(data)} bytes ({exc.msg}); "
            "re-export the trace or drop this file"
        ) from None
    if isinstance(doc, list):  # a bare event array is valid Chrome-trace JSON
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotATraceError(f"{path}: no 'traceEvents' list; this is not a PyTorch profiler (Chrome) trace")
    return doc


def _as_int(value: Any) -> int | None:
    """Kineto writes ids as ints, but some tools write tids like "stream 7" or floats; keep what is numeric."""
    if value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    digits = re.search(r"-?\d+", str(value))
    return int(digits.group()) if digits else None


def _ns(values: list[Any]) -> list[int | None]:
    """Microseconds (int or float) to integer nanoseconds without float rounding of epoch-sized values.

    ``ts * 1000`` as a float loses precision above 2**53 ns (epoch timestamps), so the whole and the
    fractional microseconds are converted separately.
    """
    out: list[int | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, int):
            out.append(v * 1000)
        else:
            whole = int(v)
            out.append(whole * 1000 + round((float(v) - whole) * 1000.0))
    return out


_INT_TEXT = r"(-?\d+)"  # the first integer in a value read as text: what _as_int keeps
_ARG_KEYS = (*_INT_ARGS.values(), *_STR_ARGS.values())
#: one raw event as Polars reads it: ids and metadata as text (their integer is extracted after), times as floats
_RAW_EVENT = {
    **dict.fromkeys(("ph", "cat", "name", "pid", "tid", "id"), pl.Utf8()),
    "ts": pl.Float64(),
    "dur": pl.Float64(),
}
_RAW_DOC = {
    "traceEvents": pl.List(pl.Struct({**_RAW_EVENT, "args": pl.Struct(dict.fromkeys(_ARG_KEYS, pl.Utf8()))})),
    "distributedInfo": pl.Struct({"rank": pl.Int64(), "world_size": pl.Int64()}),
}
_POLARS_CANNOT = (pl.exceptions.PolarsError, pl.exceptions.PanicException, TypeError, ValueError, OverflowError)


def _int_expr(col: str, alias: str | None = None) -> pl.Expr:
    """:func:`_as_int` on a text column: its first integer, or null."""
    return pl.col(col).str.extract(_INT_TEXT, 1).cast(pl.Int64).alias(alias or col)


def _ns_expr(col: str) -> pl.Expr:
    """:func:`_ns` on a Float64 column of microseconds: whole and fractional microseconds converted apart."""
    whole = pl.col(col).floor()
    return (whole.cast(pl.Int64) * 1000 + ((pl.col(col) - whole) * 1000.0).round(0).cast(pl.Int64)).alias(f"{col}_ns")


def _event_columns(raw: pl.DataFrame, rank: int) -> pl.DataFrame:
    """The event frame (EVENT_SCHEMA) of raw events with text ids, float times and the kept args as columns."""
    frame = raw.select(
        "ph",
        "cat",
        "name",
        _int_expr("pid"),
        _int_expr("tid"),
        _ns_expr("ts"),
        _ns_expr("dur").fill_null(0),
        *(_int_expr(key, col) for col, key in _INT_ARGS.items()),
        *(pl.col(key).alias(col) for col, key in _STR_ARGS.items()),
    )
    return frame.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")).select(list(EVENT_SCHEMA))


def _read_columnar(data: bytes) -> tuple[pl.DataFrame, dict[str, Any]] | None:
    """Every event of a trace document and its ``distributedInfo``, parsed by Polars in Rust (no Python dict per
    event, and without the GIL, so that files parse in parallel threads).

    None where Polars cannot take the document (a bare event array, malformed JSON, a value of another type
    than expected): the orjson path then reads it, or says exactly what is wrong with it.
    """
    try:
        doc = pl.read_json(io.BytesIO(data), schema=_RAW_DOC)
    except _POLARS_CANNOT:
        return None
    if doc.height != 1 or doc["traceEvents"][0] is None:
        return None
    events = doc.select(pl.col("traceEvents").explode()).unnest("traceEvents").filter(pl.col("ph").is_not_null())
    return events.unnest("args"), doc["distributedInfo"][0] or {}


def _event_frame(events: list[dict[str, Any]], rank: int) -> pl.DataFrame:
    """Columns of complete and instant events, built with one comprehension per column (fast in CPython).

    The path for documents :func:`_read_columnar` cannot take; it gives the same frame."""
    args = [e.get("args") or {} for e in events]
    cols: dict[str, list[Any]] = {
        "ph": [e.get("ph") for e in events],
        "cat": [e.get("cat") for e in events],
        "name": [e.get("name") for e in events],
        "pid": [_as_int(e.get("pid")) for e in events],
        "tid": [_as_int(e.get("tid")) for e in events],
        "ts_ns": _ns([e.get("ts") for e in events]),
        "dur_ns": _ns([e.get("dur", 0) for e in events]),
    }
    for col, key in _INT_ARGS.items():
        cols[col] = [_as_int(a.get(key)) for a in args]
    for col, key in _STR_ARGS.items():
        cols[col] = [None if (v := a.get(key)) is None else str(v) for a in args]
    frame = pl.DataFrame(cols, schema={k: v for k, v in EVENT_SCHEMA.items() if k != "rank"}, strict=False)
    return frame.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")).select(list(EVENT_SCHEMA))


def _flow_frame(flows: list[dict[str, Any]], rank: int) -> pl.DataFrame:
    cols = {
        "ph": [e.get("ph") for e in flows],
        "cat": [e.get("cat") for e in flows],
        "id": [_as_int(e.get("id")) for e in flows],
        "pid": [_as_int(e.get("pid")) for e in flows],
        "tid": [_as_int(e.get("tid")) for e in flows],
        "ts_ns": _ns([e.get("ts") for e in flows]),
    }
    frame = pl.DataFrame(cols, schema={k: v for k, v in FLOW_SCHEMA.items() if k != "rank"}, strict=False)
    return frame.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")).select(list(FLOW_SCHEMA))


def _flow_columns(raw: pl.DataFrame, rank: int) -> pl.DataFrame:
    """The flow frame (FLOW_SCHEMA) of raw flow events with text ids and float times."""
    frame = raw.select("ph", "cat", _int_expr("id"), _int_expr("pid"), _int_expr("tid"), _ns_expr("ts"))
    return frame.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank")).select(list(FLOW_SCHEMA))


def _rank_from_name(path: Path) -> int | None:
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def read_trace(path: str | Path, fallback_rank: int | None = None) -> TraceFile:
    """Read one Kineto trace file into a :class:`TraceFile`."""
    path = Path(path)
    if not path.is_file():
        raise DiagnoseError(f"{path}: no such trace file")
    data = load_bytes(path)
    columnar = _read_columnar(data)
    if columnar is None:
        doc = _parse_json(path, data)
        info = doc.get("distributedInfo") or {}
    else:
        raw, info = columnar
    if isinstance(info.get("rank"), int):
        rank, source = info["rank"], "distributedInfo"
    elif (named := _rank_from_name(path)) is not None:
        rank, source = named, "file name"
    elif fallback_rank is not None:
        rank, source = fallback_rank, "position"
    else:
        raise DiagnoseError(
            f"{path}: the trace has no distributedInfo.rank and its name carries no rank; "
            "name it like rank-0.json.gz or pass it within a folder"
        )
    if columnar is None:
        listed = doc["traceEvents"]
        events = _event_frame([e for e in listed if isinstance(e, dict) and e.get("ph") in ("X", "i", "I")], rank)
        flows = _flow_frame([e for e in listed if isinstance(e, dict) and e.get("ph") in _FLOW_PHASES], rank)
    else:
        events = _event_columns(raw.filter(pl.col("ph").is_in(["X", "i", "I"])), rank)
        flows = _flow_columns(raw.filter(pl.col("ph").is_in(list(_FLOW_PHASES))), rank)
    world = info.get("world_size")
    return TraceFile(
        path=path,
        rank=int(rank),
        rank_source=source,
        world_size=int(world) if isinstance(world, int) else None,
        events=events,
        flows=flows,
        metadata={"distributedInfo": info} if info else {},
    )


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while traces are parsed, restoring its state afterwards.

    Parsed JSON holds no reference cycles, yet its hundreds of thousands of new dicts trigger full collections
    that walk the whole heap: with another tool's data live, those took half of the load time.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def find_trace_files(folder: Path) -> list[Path]:
    """The trace files of a folder (not recursive), sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def read_folder(folder: str | Path, *, workers: int | None = None) -> TraceSet:
    """Read every trace of a folder (or one file) into a :class:`TraceSet`; missing ranks are listed, not fatal.

    Files are parsed on a thread pool (one thread per CPU): decompression and Polars release the GIL.
    """
    from concurrent.futures import ThreadPoolExecutor

    folder = Path(folder)
    if folder.is_file():
        paths = [folder]
    elif folder.is_dir():
        paths = find_trace_files(folder)
    else:
        raise DiagnoseError(f"{folder}: no such file or folder of traces")
    if not paths:
        raise DiagnoseError(f"{folder}: no trace files (*.json, *.json.gz) in this folder")

    def read_or_skip(index: int, path: Path) -> TraceFile | Path:
        try:
            return read_trace(path, fallback_rank=index)
        except NotATraceError:
            if len(paths) == 1:
                raise
            return path

    threads = workers or min(8, len(paths), os.cpu_count() or 1)
    with _cyclic_gc_paused(), ThreadPoolExecutor(max_workers=threads) as pool:
        read = list(pool.map(lambda ip: read_or_skip(*ip), enumerate(paths)))
    files = [r for r in read if isinstance(r, TraceFile)]
    skipped = [r for r in read if isinstance(r, Path)]
    if not files:
        raise DiagnoseError(f"{folder}: none of its {len(paths)} JSON files is a profiler trace (no 'traceEvents')")
    seen: dict[int, Path] = {}
    for f in files:
        if f.rank in seen:
            raise DiagnoseError(
                f"{f.path}: rank {f.rank} (from {f.rank_source}) also in {seen[f.rank]}; keep one trace per rank "
                "in the folder"
            )
        seen[f.rank] = f.path
    worlds = [f.world_size for f in files if f.world_size]
    world = max(worlds) if worlds else None
    expected = set(range(world)) if world else set(range(max(seen) + 1))
    return TraceSet(
        files=sorted(files, key=lambda f: f.rank),
        events=pl.concat([f.events for f in files], how="vertical"),
        flows=pl.concat([f.flows for f in files], how="vertical"),
        world_size=world,
        missing_ranks=sorted(expected - set(seen)),
        skipped=skipped,
    )
