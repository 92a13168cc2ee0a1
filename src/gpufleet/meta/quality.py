"""Which model to use for cold-start tasks: every meta variant against the baselines, chosen on validation tasks.

For one prepared folder: the plain model (epochs by early stopping), the plain model fine-tuned on each task's
support set (rate and steps from the grid), popularity and popularity plus a per-task bias (smoothing strength),
and each meta variant (its inner rate and steps from the grid, its epochs by early stopping). Every choice, the
choice of the best meta variant included, is made on the validation tasks; the cold-start tasks are scored once,
after all choices are made.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpufleet.meta.evaluate import LoadedModel, evaluate_model
from gpufleet.meta.loader import TaskStore
from gpufleet.meta.maml import MamlConfig
from gpufleet.meta.metrics import RankingScores, selection_score
from gpufleet.meta.popularity import STRENGTHS, Popularity, score_baseline
from gpufleet.meta.tune import DEFAULT_GRID, grid_points, run_grid

# the meta variants (TrainConfig settings): MAML on every layer, MeLU's decision layers only, Meta-SGD's learned
# rates on the decision layers, and a TaNP/MAMO-style task memory with MAML on the decision layers
META_VARIANTS: dict[str, dict[str, Any]] = {
    "maml": {"order": "first", "adapt": "all"},
    "maml-decision": {"order": "first", "adapt": "decision"},
    "meta-sgd": {"order": "first", "adapt": "decision", "learned_rates": True},
    "memory": {"order": "first", "adapt": "decision", "memory": 32},
}
BASELINES = ("plain", "plain-finetuned", "popularity", "task-bias")


def _row(kind: str, chosen: dict[str, Any], val: RankingScores, cold: RankingScores, metric: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "chosen": chosen,
        "val_score": selection_score(val, metric),
        "val": val.to_json(),
        "cold": cold.to_json(),
    }


def compare_methods(
    tasks: Path,
    base: Any,
    *,
    grid: dict[str, Sequence[Any]] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Every method's validation and cold-start scores on ``tasks``; ``base`` is the TrainConfig shared by all.

    Returns ``{"methods": {name: row}, "best_meta": name}`` where each row holds the chosen settings, the
    validation score it was chosen on and the cold-start scores.
    """
    grid = dict(grid or DEFAULT_GRID)
    variants = variants or META_VARIANTS
    metric = base.select
    stores = {split: TaskStore.open(tasks, split) for split in ("train", "val", "cold")}
    methods: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpufleet-meta-quality-") as tmp_name:
        tmp = Path(tmp_name)
        methods.update(_plain_rows(tasks, base, grid, stores, tmp, metric, log))
        methods.update(_count_rows(stores, metric))
        for name, settings in variants.items():
            log(f"{name}:")
            config = dataclasses.replace(base, tasks=tasks, **settings)
            keep = tmp / name
            keep.mkdir()
            best = run_grid(config, grid, keep_dir=keep, log=log)[0]
            model = LoadedModel.load(Path(best.model))
            val = evaluate_model(model, stores["val"])
            cold = evaluate_model(model, stores["cold"])
            chosen = {**settings, **best.settings, "epochs": best.best_epoch}
            methods[name] = _row("meta", chosen, val, cold, metric)
    metas = [n for n, r in methods.items() if r["kind"] == "meta"]
    best_meta = max(metas, key=lambda n: methods[n]["val_score"]) if metas else None
    return {"methods": methods, "best_meta": best_meta, "select": metric, "grid": grid}


def _plain_rows(
    tasks: Path,
    base: Any,
    grid: dict[str, Sequence[Any]],
    stores: dict[str, TaskStore],
    tmp: Path,
    metric: str,
    log: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """The plain model (epochs on validation) and the same model fine-tuned k-shot (rate and steps on validation)."""
    from gpufleet.meta.tune import train_point

    log("plain:")
    config = dataclasses.replace(base, tasks=tasks, order="none", memory=0, learned_rates=False, adapt="all")
    point = train_point(config, {}, tmp / "plain.pt")
    plain = LoadedModel.load(tmp / "plain.pt")
    none = MamlConfig(order="none")
    rows = {
        "plain": _row(
            "baseline",
            {"epochs": point.best_epoch},
            evaluate_model(plain, stores["val"], none),
            evaluate_model(plain, stores["cold"], none),
            metric,
        )
    }
    tune_keys = {k: v for k, v in grid.items() if k in ("inner_lr", "inner_steps")}
    tried = []
    for settings in grid_points(tune_keys):
        maml = MamlConfig(order="first", **settings)
        tried.append((selection_score(evaluate_model(plain, stores["val"], maml), metric), settings, maml))
    _, settings, maml = max(tried, key=lambda t: t[0])
    rows["plain-finetuned"] = _row(
        "baseline",
        {"epochs": point.best_epoch, **settings},
        evaluate_model(plain, stores["val"], maml),
        evaluate_model(plain, stores["cold"], maml),
        metric,
    )
    return rows


def _count_rows(stores: dict[str, TaskStore], metric: str) -> dict[str, dict[str, Any]]:
    """Popularity and popularity + per-task bias, each with its smoothing strength chosen on validation."""
    pop = Popularity.fit(stores["train"])
    rows = {}
    for name, bias in (("popularity", False), ("task-bias", True)):
        strength = max(STRENGTHS, key=lambda m: selection_score(score_baseline(pop, stores["val"], m, bias), metric))
        rows[name] = _row(
            "baseline",
            {"strength": strength},
            score_baseline(pop, stores["val"], strength, bias),
            score_baseline(pop, stores["cold"], strength, bias),
            metric,
        )
    return rows


def bar_checks(result: dict[str, Any], dataset: str) -> list[tuple[str, bool, str]]:
    """The issue's bar on one dataset, for the meta variant chosen on validation, judged on cold-start tasks."""
    methods, best = result["methods"], result["best_meta"]
    if best is None:
        return []
    meta, plain, tuned = (methods[n]["cold"] for n in (best, "plain", "plain-finetuned"))
    gain = meta["auc"] - plain["auc"]
    return [
        (f"{dataset}: {best} beats plain by >= 0.005 AUC", gain >= 0.005, f"{meta['auc']:.4f} vs {plain['auc']:.4f}"),
        (
            f"{dataset}: {best} GAUC no worse than plain",
            meta["gauc"] >= plain["gauc"],
            f"{meta['gauc']:.4f} vs {plain['gauc']:.4f}",
        ),
        (
            f"{dataset}: {best} beats plain fine-tuned (AUC)",
            meta["auc"] > tuned["auc"],
            f"{meta['auc']:.4f} vs {tuned['auc']:.4f}",
        ),
    ]


def quality_table(result: dict[str, Any], title: str) -> Any:
    """A Rich table: per method, the chosen settings, validation score and cold-start AUC / GAUC / NDCG@10."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("method", "chosen on validation", "val score", "AUC", "GAUC", "NDCG@10"):
        table.add_column(col, justify="left" if col in ("method", "chosen on validation") else "right")
    for name, row in result["methods"].items():
        mark = " *" if name == result["best_meta"] else ""
        chosen = " ".join(f"{k}={v}" for k, v in row["chosen"].items() if k not in ("order",))
        cold = row["cold"]
        table.add_row(
            name + mark,
            chosen,
            f"{row['val_score']:.4f}",
            f"{cold['auc']:.4f}",
            f"{cold['gauc']:.4f}",
            f"{cold['ndcg_at_10']:.4f}",
        )
    return table
