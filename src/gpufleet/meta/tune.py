"""Choosing hyper-parameters on the validation tasks: a small grid of training settings, each point trained with
early stopping and scored on the validation split only, run in this process or as Ray tasks.

The cold-start split is never read here: ``evaluate`` scores the chosen model on it once.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.errors import MetaError

# what a grid may vary, and how a value is read from text
GRID_FIELDS: dict[str, Callable[[str], Any]] = {
    "inner_lr": float,
    "inner_steps": int,
    "support_weight": float,
    "outer_lr": float,
    "emb_lr": float,
    "memory": int,
    "adapt": str,
}
DEFAULT_GRID = {"inner_lr": (0.03, 0.1, 0.3), "inner_steps": (1, 2)}
_GRID_EXAMPLE = "inner_lr=0.03,0.1,0.3;inner_steps=1,2"


def parse_grid(text: str) -> dict[str, tuple[Any, ...]]:
    """``"inner_lr=0.03,0.1;inner_steps=1,2"`` -> ``{"inner_lr": (0.03, 0.1), "inner_steps": (1, 2)}``."""
    grid: dict[str, tuple[Any, ...]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        key, sep, values = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in GRID_FIELDS:
            raise MetaError(
                f"--grid: cannot read '{part}'; write name=v1,v2;name=v1,... with names from "
                f"{', '.join(GRID_FIELDS)} (e.g. '{_GRID_EXAMPLE}')"
            )
        try:
            grid[key] = tuple(GRID_FIELDS[key](v.strip()) for v in values.split(",") if v.strip())
        except ValueError:
            raise MetaError(f"--grid: '{part}' holds a value that is not a {GRID_FIELDS[key].__name__}") from None
        if not grid[key]:
            raise MetaError(f"--grid: '{part}' lists no value")
    if not grid:
        raise MetaError(f"--grid is empty; e.g. '{_GRID_EXAMPLE}'")
    return grid


def grid_points(grid: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the order written."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


@dataclass
class PointResult:
    """One grid point: its settings, the best validation epoch and its scores, and the model file (if kept)."""

    settings: dict[str, Any]
    score: float
    best_epoch: int | None
    val: dict[str, Any]
    model: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


def train_point(config: Any, settings: dict[str, Any], export: Path | None = None) -> PointResult:
    """Train ``config`` (a TrainConfig) with ``settings`` applied, in this process; the best validation epoch's
    scores (the trainer keeps that epoch's weights), exported to ``export`` when given."""
    from gpufleet.meta.trainer import MetaTrainer

    config = dataclasses.replace(config, **settings, output=export, progress=False, checkpoint_dir=None)
    if not config.patience:
        raise MetaError("a grid is chosen on the validation tasks: it needs --patience >= 1")
    trainer = MetaTrainer(config)
    stats = trainer.fit()
    if export is not None:
        trainer.export(export)
    best = next((h for h in stats.val_history if h["epoch"] == stats.best_epoch), {})
    return PointResult(
        settings=settings,
        score=stats.best_score,
        best_epoch=stats.best_epoch,
        val=best,
        model=None if export is None else str(export),
        history=stats.val_history,
    )


def _train_point_plain(config_json: dict[str, Any], settings: dict[str, Any], export: str | None) -> dict[str, Any]:
    """``train_point`` with plain arguments and result, for a Ray worker (one torch thread: tasks share cores)."""
    import torch

    from gpufleet.meta.trainer import TrainConfig

    torch.set_num_threads(1)
    config = TrainConfig.from_json(config_json)
    return dataclasses.asdict(train_point(config, settings, None if export is None else Path(export)))


def run_grid(
    config: Any,
    grid: dict[str, Sequence[Any]],
    *,
    ray: bool | str = False,
    keep_dir: Path | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> list[PointResult]:
    """Train every grid point (in this process, or as Ray tasks with ``ray`` = True or a cluster address) and
    return them best first (validation score). With ``keep_dir`` every point's model is exported there."""
    points = grid_points(grid)
    exports = [None if keep_dir is None else keep_dir / f"point-{i}.pt" for i in range(len(points))]
    if ray:
        results = _run_ray(config, points, exports, ray)
    else:
        results = []
        for settings, export in zip(points, exports, strict=True):
            results.append(train_point(config, settings, export))
            log(f"  {_describe(settings)}: validation {results[-1].score:.4f} (epoch {results[-1].best_epoch})")
    return sorted(results, key=lambda r: -r.score)


def _run_ray(config: Any, points: list[dict[str, Any]], exports: list[Path | None], ray: bool | str) -> list:
    try:
        import ray as ray_mod
    except ImportError as exc:
        raise MetaError("--ray needs Ray: pip install 'gpufleet[ray]'") from exc
    if not ray_mod.is_initialized():
        ray_mod.init(address=ray if isinstance(ray, str) else None, include_dashboard=False, log_to_driver=False)
    remote = ray_mod.remote(num_cpus=1)(_train_point_plain)
    futures = [
        remote.remote(config.to_json(), s, None if e is None else str(e)) for s, e in zip(points, exports, strict=True)
    ]
    return [PointResult(**r) for r in ray_mod.get(futures)]


def _describe(settings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items()) or "(defaults)"


def best_model(config: Any, grid: dict[str, Sequence[Any]], output: Path, **kw: Any) -> list[PointResult]:
    """Run the grid keeping every point's model, and copy the best one (validation) to ``output``."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="gpufleet-meta-grid-") as tmp:
        results = run_grid(config, grid, keep_dir=Path(tmp), **kw)
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(results[0].model, output)
    for r in results:
        r.model = None
    return results


def results_table(results: list[PointResult], title: str = "grid on the validation tasks") -> Any:
    """A Rich table of the grid, best first."""
    from rich.table import Table

    keys = list(results[0].settings) if results else []
    table = Table(title=title)
    for col in (*keys, "epochs", "val AUC", "val GAUC", "val NDCG@10", "score"):
        table.add_column(col, justify="right")
    for i, r in enumerate(results):
        style = "bold" if i == 0 else None
        table.add_row(
            *(str(r.settings[k]) for k in keys),
            str(r.best_epoch),
            f"{r.val.get('auc', float('nan')):.4f}",
            f"{r.val.get('gauc', float('nan')):.4f}",
            f"{r.val.get('ndcg_at_10', float('nan')):.4f}",
            f"{r.score:.4f}",
            style=style,
        )
    return table
