"""G-Meta-style meta-training against the naive distributed MAML (DMAML stand-in), on MovieLens-100k.

    python bench/meta_bench.py                          # ranks 1,2,4; prepares MovieLens-100k to a temp folder
    python bench/meta_bench.py --ranks 1,2,4,8 --steps 60 --json out.json

Both trainers run as real torchrun launches (gloo on CPU, NCCL where every rank has a GPU) on the same tasks,
model and hyper-parameters. Throughput is each run's own timing of its training loop; accuracy is the cold-start
users' AUC after k-shot adaptation, after training to the end. The bar (issue 10): at 4 ranks at least 3x the
naive trainer's tasks/s at equal accuracy; 2 and 4 ranks within 0.005 AUC of the single-process MAML; and
meta-learning above the plain DLRM on cold-start AUC.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from gpufleet.meta.bench import BenchConfig, print_bench, run_bench

console = Console(width=160)


def _check(result: dict) -> list[tuple[str, bool, str]]:
    tp = result["throughput"]
    checks = []
    top = max(int(r) for r in tp["gmeta"])
    ratio = tp["gmeta"][top]["tasks_per_s"] / tp["naive"][top]["tasks_per_s"]
    checks.append((f"{top} ranks: >= 3x naive tasks/s", ratio >= 3.0, f"{ratio:.2f}x"))
    acc = result.get("accuracy")
    if acc:
        ref = acc[next(k for k in acc if k.startswith("gmeta@"))]["auc"]
        worst = max(abs(v["auc"] - ref) for k, v in acc.items() if k.startswith(("gmeta@", "naive@")))
        checks.append(("distributed AUC within 0.005 of 1 process", worst <= 0.005, f"max |dAUC| {worst:.5f}"))
        gain = ref - acc["plain"]["auc"]
        checks.append(
            (
                "meta beats the plain DLRM (cold-start AUC)",
                gain > 0,
                f"{ref:.4f} vs {acc['plain']['auc']:.4f} ({gain:+.4f}); GAUC {acc[next(iter(acc))]['gauc']:.4f}"
                f" vs {acc['plain']['gauc']:.4f}",
            )
        )
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--tasks", type=Path, default=None, help="prepared folder (default: MovieLens-100k)")
    ap.add_argument("--steps", type=int, default=40, help="meta-steps per throughput run")
    ap.add_argument("--no-accuracy", action="store_true", help="throughput only")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    args = ap.parse_args()
    config = BenchConfig(
        ranks=tuple(int(r) for r in args.ranks.split(",")),
        tasks=args.tasks,
        steps=args.steps,
        accuracy=not args.no_accuracy,
    )
    result = run_bench(config, log=lambda msg: console.print(f"[dim]{msg}[/]"))
    print_bench(result, console)
    for name, ok, detail in _check(result):
        console.print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
