"""Speed and agreement of gpufleet's GPU-time analyses against Holistic Trace Analysis (HTA) on real traces.

Builds a job of ``--ranks`` traces from the real 2-rank Kineto traces in ``tests/data/kineto`` (rank r is a
copy of source rank r mod 2 with ``distributedInfo.rank`` rewritten; nothing is shifted or jittered), optionally
makes each trace ``--repeat`` K times longer by appending K−1 copies of its events shifted in time by whole trace
lengths (with correlation / External ids and ``ProfilerStep#N`` numbers offset so that they stay unique), then
times, in the same process and ``--runs`` times each (median reported):

- gpufleet: ``read_folder`` and ``hta_window`` (the load: HTA's load also assigns iterations and drops the last
  step), then ``temporal_breakdown`` + ``comm_comp_overlap`` + ``late_start_stragglers`` on that window;
- HTA 0.5.0: ``TraceAnalysis(trace_dir=...)`` + ``get_temporal_breakdown`` + ``get_comm_comp_overlap`` +
  ``get_potential_stragglers``,

and prints two markdown tables: time per stage with the speed-up, and per-rank agreement of the figures.

    python bench/diagnose_speed.py --ranks 8 --repeat 4
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import platform
import re
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT / "tests" / "data" / "kineto"  # HTA's test traces, copied into the repository
SOURCES = ["trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz"]
STAGES = ["load", "temporal breakdown", "overlap", "straggler"]
_STEP = re.compile(r"^(ProfilerStep\s*#\s*)(\d+)$")
_ID_ARGS = ("correlation", "External id")


def _load(path: Path) -> dict[str, Any]:
    return orjson.loads(gzip.decompress(path.read_bytes()))


def _extent(doc: dict[str, Any]) -> tuple[int, int]:
    """First start and last end (µs) over the trace's timed events."""
    timed = [e for e in doc["traceEvents"] if isinstance(e.get("ts"), int | float) and e.get("ph") != "M"]
    return min(e["ts"] for e in timed), max(e["ts"] + e.get("dur", 0) for e in timed)


def _repeated(doc: dict[str, Any], k: int, period: int) -> list[dict[str, Any]]:
    """The trace's events k times: copy j shifted by j·period µs, ids and step numbers offset per copy."""
    events = doc["traceEvents"]
    max_id = max(
        [int(v) for e in events for key in _ID_ARGS if isinstance(v := (e.get("args") or {}).get(key), int)]
        + [int(e["id"]) for e in events if isinstance(e.get("id"), int)]
        + [0]
    )
    steps = [int(m.group(2)) for e in events if (m := _STEP.match(str(e.get("name", ""))))]
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    out: list[dict[str, Any]] = []
    for j in range(k):
        for e in events:
            if j and e.get("ph") == "M":
                continue  # process/thread names once
            if not j:
                out.append(e)
                continue
            e = dict(e)
            if isinstance(e.get("ts"), int | float):
                e["ts"] = e["ts"] + j * period
            if isinstance(e.get("id"), int):
                e["id"] = e["id"] + j * (max_id + 1)
            if args := e.get("args"):
                e["args"] = args = dict(args)
                for key in _ID_ARGS:
                    if isinstance(args.get(key), int) and args[key] >= 0:
                        args[key] += j * (max_id + 1)
            if m := _STEP.match(str(e.get("name", ""))):
                e["name"] = f"{m.group(1)}{int(m.group(2)) + j * step_span}"
            out.append(e)
    return out


def _write(path: Path, doc: dict[str, Any], rank: int, events: list[dict[str, Any]]) -> None:
    """Kineto's layout: metadata first (``"rank": N`` with a space, which HTA's rank scan needs), one event a line."""
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    meta["distributedInfo"] = {**meta.get("distributedInfo", {}), "rank": rank}
    head = json.dumps(meta)[1:-1]
    body = b",\n".join(orjson.dumps(e) for e in events)
    path.write_bytes(
        gzip.compress(b"{\n  " + head.encode() + b',\n  "traceEvents": [\n' + body + b"\n]}\n", compresslevel=3)
    )


def build_job(folder: Path, ranks: int, repeat: int) -> dict[str, Any]:
    """Write the scaled job into ``folder``; returns a description of what was written."""
    docs = [_load(KINETO / s) for s in SOURCES]
    extents = [_extent(d) for d in docs]
    period = max(end for _, end in extents) - min(start for start, _ in extents) + 1000  # same shift on all ranks
    events = [_repeated(d, repeat, period) if repeat > 1 else d["traceEvents"] for d in docs]
    for r in range(ranks):
        _write(folder / f"rank-{r}.json.gz", docs[r % 2], r, events[r % 2])
    size = sum(p.stat().st_size for p in folder.iterdir())
    return {"events_per_rank": [len(e) for e in events], "gz_mb": size / 2**20}


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (HTA parses ranks in a process pool)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """((wall s, CPU s), result) of ``fn()``."""
    t0, c0 = time.perf_counter(), _cpu_s()
    out = fn()
    return (time.perf_counter() - t0, _cpu_s() - c0), out


def run_gpufleet(folder: Path) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    from gpufleet.diagnose.gpu_time import comm_comp_overlap, hta_window, temporal_breakdown
    from gpufleet.diagnose.kineto import read_folder
    from gpufleet.diagnose.late_start import late_start_stragglers

    times: dict[str, tuple[float, float]] = {}
    # load = parse + HTA's window (iterations, last step dropped), which HTA's own load also does
    times["load"], ev = _timed(lambda: hta_window(read_folder(folder).events))
    times["temporal breakdown"], tb = _timed(lambda: temporal_breakdown(ev))
    times["overlap"], ov = _timed(lambda: comm_comp_overlap(ev))
    times["straggler"], st = _timed(lambda: late_start_stragglers(ev, num_candidates=2))
    return times, {"temporal": tb, "overlap": ov, "straggler": st}


def run_hta(folder: Path) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    from hta.trace_analysis import TraceAnalysis

    times: dict[str, tuple[float, float]] = {}
    times["load"], analysis = _timed(lambda: TraceAnalysis(trace_dir=str(folder)))
    times["temporal breakdown"], tb = _timed(lambda: analysis.get_temporal_breakdown(visualize=False))
    times["overlap"], ov = _timed(lambda: analysis.get_comm_comp_overlap(visualize=False))
    times["straggler"], st = _timed(lambda: analysis.get_potential_stragglers(num_candidates=2))
    return times, {"temporal": tb, "overlap": ov, "straggler": st, "analysis": analysis}


def _hta_metric(analysis: Any) -> dict[tuple[int, int], float]:
    """HTA's late-start metric per (rank, iteration), from its internal function (not timed)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from hta_reference import _late_start_metric

    return {(r["rank"], r["iteration"]): r["normalized_start"] for r in _late_start_metric(analysis)["rows"]}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)


def agreement(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[list[list[str]], float]:
    """Rows (rank, figure, gpufleet, HTA, relative difference) and the largest relative difference."""
    rows: list[list[str]] = []
    worst = 0.0
    tb = {r["rank"]: r for r in ours["temporal"].iter_rows(named=True)}
    ov = {r["rank"]: r["overlap_pct"] for r in ours["overlap"].iter_rows(named=True)}
    metric: dict[int, list[tuple[float, float]]] = {}
    hta_metric = _hta_metric(theirs["analysis"])
    for r in ours["straggler"].metric.iter_rows(named=True):
        metric.setdefault(r["rank"], []).append((r["normalized_start"], hta_metric[(r["rank"], r["iteration"])]))
    hta_ov = dict(zip(theirs["overlap"]["rank"], theirs["overlap"]["comp_comm_overlap_pctg"], strict=True))
    for h in theirs["temporal"].to_dict("records"):
        rank = int(h["rank"])
        figures = [
            ("idle (µs)", tb[rank]["idle_ns"] / 1e3, h["idle_time(us)"]),
            ("compute (µs)", tb[rank]["compute_ns"] / 1e3, h["compute_time(us)"]),
            ("non-compute (µs)", tb[rank]["non_compute_ns"] / 1e3, h["non_compute_time(us)"]),
            ("GPU span (µs)", tb[rank]["span_ns"] / 1e3, h["kernel_time(us)"]),
            ("idle %", tb[rank]["idle_pct"], h["idle_time_pctg"]),
            ("compute %", tb[rank]["compute_pct"], h["compute_time_pctg"]),
            ("non-compute %", tb[rank]["non_compute_pct"], h["non_compute_time_pctg"]),
            ("comm/comp overlap %", ov[rank], hta_ov[rank]),
        ]
        pairs = metric.get(rank, [])
        if pairs:
            g = statistics.fmean(p[0] for p in pairs)
            t = statistics.fmean(p[1] for p in pairs)
            figures.append((f"late-start metric (mean of {len(pairs)} steps)", g, t))
            worst = max(worst, *(_rel(a, b) for a, b in pairs))
        for name, g, t in figures:
            # HTA rounds its percentages to 2 decimals: count a difference within that rounding as none
            diff = 0.0 if name.endswith("%") and abs(g - t) <= 0.005 else _rel(g, t)
            worst = max(worst, diff)
            fmt = "{:,.1f}" if "µs" in name else "{:.2f}" if name.endswith("%") else "{:.4f}"
            rows.append([str(rank), name, fmt.format(g), fmt.format(t), f"{100 * diff:.3f} %"])
    return rows, worst


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="ranks in the scaled job (default 8)")
    parser.add_argument("--repeat", type=int, default=1, help="copies of each trace's events, shifted in time")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each tool (median reported)")
    args = parser.parse_args(argv)
    if not all((KINETO / s).is_file() for s in SOURCES):
        print(f"the real traces are missing from {KINETO}", file=sys.stderr)
        return 2

    logging.getLogger("hta").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    import hta.version
    import pandas as pd
    import polars as pl

    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        folder = Path(tmp)
        info = build_job(folder, args.ranks, args.repeat)
        ours_t: dict[str, list[tuple[float, float]]] = {s: [] for s in STAGES}
        hta_t: dict[str, list[tuple[float, float]]] = {s: [] for s in STAGES}
        for _ in range(args.runs):  # interleaved, so that both tools see the same machine state
            times, ours = run_gpufleet(folder)
            for s in STAGES:
                ours_t[s].append(times[s])
            times, theirs = run_hta(folder)
            for s in STAGES:
                hta_t[s].append(times[s])
        rows_agree, worst = agreement(ours, theirs)
        same_candidates = sorted(ours["straggler"].candidates) == sorted(theirs["straggler"])

    med_ours = {s: statistics.median(w for w, _ in v) for s, v in ours_t.items()}
    med_hta = {s: statistics.median(w for w, _ in v) for s, v in hta_t.items()}
    cpu_ours = {s: statistics.median(c for _, c in v) for s, v in ours_t.items()}
    cpu_hta = {s: statistics.median(c for _, c in v) for s, v in hta_t.items()}
    for d in (med_ours, med_hta, cpu_ours, cpu_hta):
        d["total"] = sum(d.values())
    print(
        f"Job: {args.ranks} ranks copied from the real 2-rank trace (trace_filter__sampled_rank-0/1), "
        f"{'each trace repeated ' + str(args.repeat) + '× in time' if args.repeat > 1 else 'not repeated'}; "
        f"{info['events_per_rank'][0]:,} / {info['events_per_rank'][1]:,} events per rank, "
        f"{info['gz_mb']:.1f} MB gzipped. Median of {args.runs} runs. "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, polars {pl.__version__}, "
        f"pandas {pd.__version__}, HTA {'.'.join(map(str, hta.version.__version_tuple__))}.\n"
    )
    rows = [
        [
            s,
            f"{med_ours[s]:.3f}",
            f"{med_hta[s]:.3f}",
            f"{med_hta[s] / med_ours[s]:.1f}×",
            f"{cpu_ours[s]:.2f}",
            f"{cpu_hta[s]:.2f}",
        ]
        for s in [*STAGES, "total"]
    ]
    print(_table(["stage", "gpufleet s", "HTA s", "speed-up ×", "gpufleet CPU s", "HTA CPU s"], rows))
    print(
        "\nWall-clock seconds; CPU s adds the time of every thread and child process (HTA parses the ranks in a "
        f"pool of min({os.cpu_count()} CPUs, ranks) processes; gpufleet reads them on a thread pool)."
    )
    print()
    print(_table(["rank", "figure", "gpufleet", "HTA", "rel. diff."], rows_agree))
    print()
    speedup = med_hta["total"] / med_ours["total"]
    print(
        f"Straggler candidates: gpufleet {ours['straggler'].candidates}, HTA {theirs['straggler']} "
        f"({'same ranks' if same_candidates else 'DIFFERENT'}). Largest relative difference {100 * worst:.3f} % "
        f"(bar 2 %); total speed-up {speedup:.1f}× (bar 5×): "
        f"{'PASS' if worst <= 0.02 and speedup >= 5 and same_candidates else 'FAIL'}."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
