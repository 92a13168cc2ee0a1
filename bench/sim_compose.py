"""Composition of the three scheduling layers with every simulator feature, on the bundled Philly trace.

Builds a small failure fleet (``gpufleet health generate``, sized to the default cluster's training GPUs) and a
failure model (``gpufleet health train``) in a temporary folder, then runs, through the CLI::

    gpufleet simulate --policy aryl,tiresias --placement contention --network \\
        --failures F --predictor M --inference punica

then every Aryl variant under ``consolidate`` and ``contention`` with the network and the failures on, and
prints per run: avg JCT, avg queue, failures injected, predictor drains, loaned GPU-h and wall seconds (the
simulation's own, and the whole command's, which runs several policies).
Run with ``python bench/sim_compose.py [--gpus 640] [--days 30]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ARYL = ("aryl", "aryl-loan", "aryl-elastic", "aryl-base")


def cli(*args: str) -> str:
    """Run ``gpufleet`` in a subprocess (the same interpreter and PYTHONPATH); its stdout."""
    res = subprocess.run([sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"gpufleet {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=640, help="fleet GPUs (default: the default cluster's training GPUs)")
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--failure-scale", type=float, default=20.0)
    args = ap.parse_args()
    console = Console(width=140)
    with tempfile.TemporaryDirectory() as tmp:
        fleet, model = Path(tmp) / "fleet.parquet", Path(tmp) / "model.pkl"
        t0 = time.perf_counter()
        cli(
            "health",
            "generate",
            "-o",
            str(fleet),
            "--gpus",
            str(args.gpus),
            "--days",
            str(args.days),
            "--seed",
            "4",
            "--failure-scale",
            str(args.failure_scale),
        )
        half = max(args.days // 2, 8)
        cli(
            "health",
            "train",
            str(fleet),
            "-o",
            str(model),
            "--model",
            "gbdt",
            "--train-span",
            f"{half - 5}d",
            "--calibrate",
            "3d",
            "--until",
            f"{half}d",
            "--window",
            "3d",
            "--horizon",
            "48h",
            "--budget",
            "0.02",
        )
        console.print(f"fleet and model built in {time.perf_counter() - t0:.0f} s ({args.gpus} GPUs, {args.days} days)")
        common = ["--network", "--failures", str(fleet), "--predictor", str(model), "--inference", "punica", "--json"]
        # the command, as typed, is the first run; then every Aryl variant, each under both placements
        runs = [["--policy", "aryl,tiresias", "--placement", "contention"]]
        runs += [["--policy", ",".join(ARYL[1:]), "--placement", "consolidate,contention"]]
        runs += [["--policy", "aryl"]]
        table = Table(title="Philly, network + failures + predictor + punica inference", header_style="bold")
        for col in ("run", "predictor", "avg JCT s", "avg queue s", "failures", "drains", "loaned GPU-h", "wall s"):
            table.add_column(col, justify="left" if col in ("run", "predictor") else "right")
        for extra in runs:
            t0 = time.perf_counter()
            rows = json.loads(cli("simulate", *extra, *common))
            wall = time.perf_counter() - t0
            for r in rows:
                name = r["policy"] if r.get("placement") in (None, "consolidate") else f"{r['policy']}+{r['placement']}"
                table.add_row(
                    name,
                    "yes" if r.get("predictor") else "no",
                    f"{r['avg_jct_s']:,.0f}",
                    f"{r['avg_queue_s']:,.0f}",
                    f"{r.get('failures', 0):,}",
                    f"{r.get('drains', 0):,}",
                    f"{r.get('loaned_gpu_hours', 0.0):,.0f}",
                    f"{r.get('wall_s', 0.0):.1f} (cli {wall:.0f})",
                )
        console.print(table)


if __name__ == "__main__":
    main()
