"""Reference figures from Holistic Trace Analysis (HTA) for ``tests/diagnose/test_gpu_time.py``.

Runs HTA's ``TraceAnalysis`` on the real Kineto traces in ``tests/data/kineto`` (each job in a folder of its
own, since HTA takes one folder per job) and writes what its temporal breakdown, communication/computation
overlap and late-start straggler analysis report, plus the per-rank metric behind the stragglers, to
``tests/diagnose/data/hta_reference.json``. An analysis that HTA cannot run on a trace is recorded with its error.

    pip install HolisticTraceAnalysis==0.5.0 psutil
    python bench/hta_reference.py [--traces tests/data/kineto] [--out tests/diagnose/data/hta_reference.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from gpufleet.report.fmt import clean_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT / "tests" / "data" / "kineto"
DEFAULT_OUT = ROOT / "tests" / "diagnose" / "data" / "hta_reference.json"

_SAMPLED = ["trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz"]
#: case -> (its trace files in the traces folder, one per rank; HTA's include_last_profiler_step)
CASES: dict[str, tuple[list[str], bool]] = {
    "sampled_2rank": (_SAMPLED, False),
    "sampled_2rank_last_step": (_SAMPLED, True),
    "alexnet_1rank": (["critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"], False),
    "cupti_profiler_1rank": (["cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz"], False),
}


def _records(frame: Any) -> list[dict[str, Any]]:
    return clean_json(frame.to_dict("records"))


def _late_start_metric(analysis: Any) -> dict[str, Any]:
    """The per-rank metric behind ``get_potential_stragglers`` (HTA keeps it internal; same selection as it does)."""
    import pandas as pd
    from hta.analyzers.straggler import _compute_normalized_start_time_of_significant_comm_kernels
    from hta.analyzers.straggler_analysis import StragglerAnalysis

    t = analysis.t
    steps = StragglerAnalysis.get_profiler_steps(t)
    ranks = list(t.get_all_traces().keys())
    df = pd.concat([t.get_trace(r) for r in ranks], axis=0, keys=ranks, names=["rank", "idx"]).reset_index()
    metric, name = _compute_normalized_start_time_of_significant_comm_kernels(
        df.loc[df["iteration"].isin(steps)], t.symbol_table
    )
    sym = t.symbol_table.get_sym_table()
    return {
        "steps": [int(s) for s in steps],
        "stream": int(metric["stream"].iloc[0]),
        "kernel": sym[int(metric["name"].iloc[0])],
        "rows": [
            {"rank": int(r.rank), "iteration": int(r.iteration), "normalized_start": float(getattr(r, name))}
            for r in metric.itertuples()
        ],
    }


def _attempt(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # HTA fails on some traces; the reference records how
        return {"error": f"{type(exc).__name__}: {exc}"}


def reference_for(folder: Path, include_last_step: bool = False) -> dict[str, Any]:
    """HTA's figures for the job whose traces are in ``folder``."""
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=include_last_step)
    out: dict[str, Any] = {
        "temporal_breakdown": _attempt(lambda: _records(analysis.get_temporal_breakdown(visualize=False))),
        "comm_comp_overlap": _attempt(lambda: _records(analysis.get_comm_comp_overlap(visualize=False))),
    }
    for k in (1, 2):
        out[f"potential_stragglers_{k}"] = _attempt(
            lambda k=k: [int(r) for r in analysis.get_potential_stragglers(num_candidates=k)]
        )
    out["late_start_metric"] = _attempt(lambda: _late_start_metric(analysis))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder of the real Kineto traces")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    import hta.version
    import pandas as pd

    logging.getLogger("hta").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    doc: dict[str, Any] = {
        "produced_by": "python bench/hta_reference.py",
        "hta_version": ".".join(map(str, hta.version.__version_tuple__)),
        "pandas_version": pd.__version__,
        "python_version": platform.python_version(),
        "units": "HTA's: microseconds (the traces' own unit) and percentages rounded to 2 decimals",
        "cases": {},
    }
    for case, (files, include_last_step) in CASES.items():
        paths = [args.traces / f for f in files]
        if not all(p.is_file() for p in paths):
            print(f"{case}: skipped, missing {[str(p) for p in paths if not p.is_file()]}", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            for p in paths:
                (Path(tmp) / p.name).symlink_to(p.resolve())
            result = reference_for(Path(tmp), include_last_step)
        doc["cases"][case] = {"files": files, "include_last_step": include_last_step, **result}
        print(f"{case}: {', '.join(k for k, v in result.items() if not (isinstance(v, dict) and 'error' in v))}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
