"""Punica's multi-LoRA text-generation benchmark, the issue's bar: under Distinct popularity gpufleet serves at
least 8x the tokens/s of one-adapter-at-a-time serving (PEFT-style) and within 1.5x of the base model alone.

    python bench/serve_bench.py                                    # 2-core CPU, small random Llama, fp32
    python bench/serve_bench.py --device cuda --dtype float16 --base wide-llama-random

Baselines run in the same process on the same requests and the same engine code: ``per_adapter`` (each adapter's
requests as their own batch, one adapter after another) and ``base_only`` (no adapter at all, fully batched).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpufleet.serve.bench import POPULARITIES, PUNICA_BAR, ServeBenchConfig, WorkloadConfig, bar_rows, run_serve_bench
from gpufleet.serve.bench_table import serve_bench_table

console = Console(width=160)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="small-llama-random", help="random shape name or a Hugging Face folder")
    ap.add_argument("--requests", type=int, default=WorkloadConfig().requests)
    ap.add_argument("--popularity", default=",".join(POPULARITIES))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=3, help="runs per system, in turns; the median run is reported")
    ap.add_argument("--json-out", type=Path, help="also write the raw results here")
    args = ap.parse_args()

    config = ServeBenchConfig(
        base=args.base,
        rank=args.rank,
        device=args.device,
        dtype=args.dtype,
        popularities=tuple(p for p in args.popularity.split(",") if p),
        workload=WorkloadConfig(requests=args.requests),
        repeat=args.repeat,
    )
    t0 = time.perf_counter()
    results = run_serve_bench(config, log=lambda msg: console.log(msg))
    wall = time.perf_counter() - t0
    console.print(serve_bench_table(results))

    bar = Table(
        title=f"the bar (Distinct): >= {PUNICA_BAR['per_adapter_speedup']:g}x per-adapter, base-only "
        f"within {PUNICA_BAR['base_only_slowdown']:g}x",
        header_style="bold",
    )
    for col in ("popularity", "gpufleet ÷ per-adapter", "base-only ÷ gpufleet", "met"):
        bar.add_column(col, justify="left" if col == "popularity" else "right")
    for row in bar_rows(results):
        met = "" if row["met"] is None else ("yes" if row["met"] else "NO")
        bar.add_row(row["popularity"], f"{row['per_adapter_speedup']:.2f}×", f"{row['base_only_slowdown']:.2f}×", met)
    console.print(bar)
    console.print(
        f"{args.base} on {args.device} ({args.dtype}), rank {args.rank}, {args.requests} requests per "
        f"popularity, batches of {config.workload.batch}, median of {args.repeat} runs per system; "
        f"{wall:.0f} s in all"
    )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
