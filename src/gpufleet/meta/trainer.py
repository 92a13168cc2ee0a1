"""The G-Meta-style trainer: one process per rank, whole tasks per rank, hybrid parallelism.

Per meta-step every rank takes its share of the step's tasks from the Meta-IO loader, looks up the batch's
deduplicated ids once (one all-to-all round trip to the shards that own them), runs all its tasks' inner loops
at once (vmap, no communication), and backpropagates the query losses. Embedding gradients return to their
owners through the all-to-all's backward; dense gradients are summed with ONE all-reduce per step. The losses
are scaled by the global number of tasks per step, so 1, 2 or 4 ranks compute the same update.

Model selection uses the prepared folder's validation tasks only: after every epoch all ranks score the same
validation tasks (after k-shot adaptation), so they take the same decision; the weights of the best epoch are kept
and training stops after ``patience`` epochs without improvement (``epochs`` is then the most it may run).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpufleet.errors import MetaError
from gpufleet.meta.checkpoint import export_model, latest_checkpoint, load_checkpoint, save_checkpoint
from gpufleet.meta.comm import all_reduce_sum_, default_timer, world_and_rank
from gpufleet.meta.dense import ModelConfig, build_model
from gpufleet.meta.embedding import ShardedEmbedding
from gpufleet.meta.loader import MetaLoader, TaskStore
from gpufleet.meta.maml import MamlConfig, dense_params, task_losses
from gpufleet.meta.metrics import SELECT_METRICS, RankingScores, selection_score
from gpufleet.meta.schema import VAL_FILE, TaskBatch
from gpufleet.meta.scoring import score_store

_VAL_FIX = "prepare the folder again (gpufleet meta prepare writes val.parquet), or pass --patience 0"


def _open_val(config: TrainConfig) -> TaskStore | None:
    """The validation split, when the folder has one; a folder without it is an error only if selection is on."""
    if (Path(config.tasks) / VAL_FILE).is_file():
        store = TaskStore.open(config.tasks, "val")
        return store if store.num_tasks else None
    if config.patience:
        raise MetaError(f"{config.tasks}: no {VAL_FILE} to choose the epochs on; {_VAL_FIX}")
    return None


@dataclass
class TrainConfig:
    """Everything a training run needs; the same object drives 1 process or N ranks under torchrun."""

    tasks: Path
    output: Path | None = None
    model: str = "dlrm"
    emb_dim: int = 16
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (64, 32)
    order: str = "first"
    inner_lr: float = 0.1
    inner_steps: int = 1
    adapt_embeddings: bool = False
    support_weight: float = 0.5
    adapt: str = "all"
    learned_rates: bool = False
    memory: int = 0
    epochs: int = 30
    patience: int | None = 3
    select: str = "mean"
    tasks_per_step: int = 32
    outer_lr: float = 2e-3
    emb_lr: float = 0.05
    seed: int = 0
    max_steps: int | None = None
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 50
    resume: bool = False
    prefetch: int = 2
    die_at_step: int | None = None
    die_rank: int = 0
    progress: bool = False

    def model_config(self, store: TaskStore) -> ModelConfig:
        meta = store.meta
        return ModelConfig(
            kind=self.model,
            num_sparse=meta.num_sparse,
            num_dense=meta.num_dense,
            emb_dim=self.emb_dim,
            bottom=tuple(self.bottom),
            top=tuple(self.top),
            adapt=self.adapt,
            learned_rates=self.learned_rates,
            rate_init=self.inner_lr,
            memory=self.memory,
        )

    def maml_config(self) -> MamlConfig:
        return MamlConfig(
            order=self.order,
            inner_lr=self.inner_lr,
            inner_steps=self.inner_steps,
            adapt_embeddings=self.adapt_embeddings,
            support_weight=self.support_weight,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("tasks", "output", "checkpoint_dir"):
            data[key] = None if data[key] is None else str(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainConfig:
        """The inverse of ``to_json`` (fields it does not know are ignored: older exports)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("tasks", "output", "checkpoint_dir"):
            if known.get(key) is not None:
                known[key] = Path(known[key])
        for key in ("bottom", "top"):
            if key in known:
                known[key] = tuple(known[key])
        return cls(**known)


@dataclass
class TrainStats:
    """What one rank measured: steps, tasks and samples done, and where its time went."""

    rank: int
    world: int
    steps: int = 0
    tasks: int = 0
    samples: int = 0
    wall_s: float = 0.0
    data_wait_s: float = 0.0
    comm_s: float = 0.0
    compute_s: float = 0.0
    comm: dict[str, Any] = field(default_factory=dict)
    final_loss: float = float("nan")
    start_step: int = 0
    val_history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int | None = None
    best_score: float = float("nan")


def batch_tensors(batch: TaskBatch) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """A Meta-IO batch as torch tensors: unique ids, support set and query set (no copies where possible)."""
    t = torch.from_numpy
    sup = (t(batch.sup_idx), t(batch.sup_dense), t(batch.sup_label), t(batch.sup_mask))
    qry = (t(batch.qry_idx), t(batch.qry_dense), t(batch.qry_label), t(batch.qry_mask))
    return t(batch.unique_ids), sup, qry


class MetaTrainer:
    """Owns the model, the sharded table, the optimisers and the loop of one rank."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.world, self.rank = world_and_rank()
        if config.tasks_per_step < 1:
            raise MetaError("--tasks-per-step must be at least 1")
        if config.order == "none" and (config.memory or config.learned_rates):
            raise MetaError("--memory and --maml meta-sgd need meta-learning: they do not combine with --maml none")
        if config.select not in SELECT_METRICS:
            raise MetaError(f"--select {config.select!r}: choose one of {', '.join(SELECT_METRICS)}")
        self.store = TaskStore.open(config.tasks, "train")
        self.val_store = _open_val(config)
        self.model_config = config.model_config(self.store)
        self.maml = config.maml_config()
        self.model = build_model(self.model_config, seed=config.seed)
        self.embedding = ShardedEmbedding(self.store.meta.num_rows, config.emb_dim, seed=config.seed)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.outer_lr, fused=True)
        self.step = 0
        self.timer = default_timer()
        self._best: dict[str, Any] | None = None

    # ------------------------------------------------------------------ validation and early stopping
    def validate(self) -> RankingScores:
        """Scores on the validation tasks after k-shot adaptation; a collective, the same figures on every rank."""
        if self.val_store is None:
            raise MetaError(f"{self.config.tasks}: no validation split; {_VAL_FIX}")

        def rows_of(ids: np.ndarray) -> torch.Tensor:
            return self.embedding.lookup(torch.from_numpy(ids))

        with torch.no_grad():
            return score_store(self.model, rows_of, self.val_store, self.maml)

    def _end_of_epoch(self, epoch: int, stats: TrainStats) -> bool:
        """Score the validation tasks, keep the best epoch's weights; False once ``patience`` epochs did not improve."""
        scores = self.validate()
        score = selection_score(scores, self.config.select)
        stats.val_history.append({"epoch": epoch, "score": score, **scores.to_json()})
        if self._best is None or score > self._best["score"]:
            self._best = {
                "score": score,
                "epoch": epoch,
                "dense": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "rows": self.embedding.weight.detach().clone(),
                "adagrad": self.embedding.adagrad_sum.clone(),
            }
        stats.best_epoch, stats.best_score = self._best["epoch"], self._best["score"]
        return epoch - self._best["epoch"] < (self.config.patience or 0)

    def _restore_best(self) -> None:
        """Put the best validation epoch's weights back (dense layers and this rank's rows)."""
        if self._best is None:
            return
        self.model.load_state_dict(self._best["dense"])
        with torch.no_grad():
            self.embedding.weight.copy_(self._best["rows"])
            self.embedding.adagrad_sum.copy_(self._best["adagrad"])

    # ------------------------------------------------------------------ checkpoints
    def restore(self) -> bool:
        """Load the newest complete checkpoint when resuming; False when there is none."""
        if not (self.config.resume and self.config.checkpoint_dir):
            return False
        path = latest_checkpoint(self.config.checkpoint_dir)
        if path is None:
            return False
        step, dense_state, optimizer_state, _extra = load_checkpoint(path, embedding=self.embedding)
        self.model.load_state_dict(dense_state)
        self.optimizer.load_state_dict(optimizer_state)
        self.step = step
        return True

    def save(self) -> None:
        if self.config.checkpoint_dir is None:
            return
        save_checkpoint(
            self.config.checkpoint_dir,
            self.step,
            embedding=self.embedding,
            dense_state=self.model.state_dict(),
            optimizer_state=self.optimizer.state_dict(),
            extra={"config": self.config.to_json(), "world": self.world},
        )

    def export(self, path: Path) -> None:
        export_model(
            path,
            embedding=self.embedding,
            dense_state=self.model.state_dict(),
            meta={
                "model": self.model_config.to_json(),
                "maml": asdict(self.maml),
                "train": self.config.to_json(),
                "tasks_meta": self.store.meta.to_json(),
                "steps": self.step,
                "world": self.world,
            },
        )

    # ------------------------------------------------------------------ one meta-step
    def meta_step(self, batch: TaskBatch) -> float:
        """Lookup, inner loops, outer backward, one dense all-reduce, optimiser steps; returns the local loss."""
        ids, sup, qry = batch_tensors(batch)
        peers = None if batch.peer_ids is None else [torch.from_numpy(p) for p in batch.peer_ids]
        table = self.embedding.lookup(ids, peer_ids=peers)
        params = dense_params(self.model)
        losses = task_losses(self.model, params, table, sup, qry, self.maml)
        loss = losses.sum() / self.config.tasks_per_step
        loss.backward()
        grads = []
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        all_reduce_sum_(grads)
        self._apply_updates()
        return float(loss.detach())

    def _apply_updates(self) -> None:
        """Adam on the dense layers, row-sparse Adagrad on this rank's embedding rows, then clear the gradients."""
        self.optimizer.step()
        self.embedding.step(self.config.emb_lr)
        self.optimizer.zero_grad(set_to_none=True)
        self.embedding.zero_grad()

    def _close_stats(self, stats: TrainStats, start: float) -> None:
        """Wall time since ``start`` and its split into communication, data wait and compute."""
        stats.wall_s = time.perf_counter() - start
        stats.comm = self.timer.as_dict()
        stats.comm_s = self.timer.total_seconds
        stats.compute_s = max(0.0, stats.wall_s - stats.comm_s - stats.data_wait_s)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainStats:
        cfg = self.config
        self.restore()
        stats = TrainStats(rank=self.rank, world=self.world, start_step=self.step)
        loader = MetaLoader(
            self.store,
            cfg.tasks_per_step,
            self.rank,
            self.world,
            seed=cfg.seed,
            prefetch=cfg.prefetch,
            peer_ids=self.world > 1,
        )
        per_epoch = len(loader)
        if per_epoch == 0:
            raise MetaError(
                f"{cfg.tasks}: {self.store.num_tasks} training tasks are fewer than --tasks-per-step "
                f"{cfg.tasks_per_step}; lower it"
            )
        total = per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)
        bar = _progress_bar(total, self.step, enabled=cfg.progress and self.rank == 0)
        self.timer.reset()
        start = time.perf_counter()
        select = bool(cfg.patience) and self.val_store is not None
        while self.step < total:
            epoch, skip = divmod(self.step, per_epoch)
            loader.set_epoch(epoch)
            self._run_epoch(loader, skip, total, stats, bar)
            if select and self.step % per_epoch == 0 and not self._end_of_epoch(epoch + 1, stats):
                break
        if select:
            self._restore_best()
        self._close_stats(stats, start)
        if bar is not None:
            bar.close()
        self.save()
        return stats

    def _run_epoch(self, loader: MetaLoader, skip: int, total: int, stats: TrainStats, bar: Any) -> bool:
        iterator = iter(loader.iter_from(skip))
        while self.step < total:
            t0 = time.perf_counter()
            batch = next(iterator, None)
            stats.data_wait_s += time.perf_counter() - t0
            if batch is None:
                return True
            stats.final_loss = self.meta_step(batch)
            self.step += 1
            stats.steps += 1
            stats.tasks += batch.num_tasks
            stats.samples += batch.num_samples
            if bar is not None:
                bar.update(1)
            self._maybe_die()
            if self.config.checkpoint_every and self.step % self.config.checkpoint_every == 0:
                self.save()
        return True

    def _maybe_die(self) -> None:
        """Fault injection for the resume test: this rank exits hard, without cleanup, after the given step."""
        if (
            self.config.die_at_step is not None
            and self.step == self.config.die_at_step
            and self.rank == self.config.die_rank
        ):
            os._exit(17)


class _ProgressBar:
    """A Rich progress bar on stderr for rank 0 (the other ranks stay quiet)."""

    def __init__(self, total: int, done: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("meta-train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.progress.add_task("steps", total=total, completed=done)
        self.progress.start()

    def update(self, n: int) -> None:
        self.progress.advance(self.task, n)

    def close(self) -> None:
        self.progress.stop()


def _progress_bar(total: int, done: int, enabled: bool) -> _ProgressBar | None:
    return _ProgressBar(total, done) if enabled else None


def gather_stats(stats: TrainStats) -> list[dict[str, Any]]:
    """Every rank's stats on every rank (one all_gather_object), rank order."""
    import torch.distributed as dist

    mine = asdict(stats)
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def write_stats(path: Path, config: TrainConfig, ranks: list[dict[str, Any]]) -> None:
    """The run's measured figures as JSON (read by the bench and by ``gpufleet meta train``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    wall = max(r["wall_s"] for r in ranks)
    tasks = sum(r["tasks"] for r in ranks)
    summary = {
        "config": config.to_json(),
        "world": len(ranks),
        "ranks": ranks,
        "wall_s": wall,
        "tasks": tasks,
        "samples": sum(r["samples"] for r in ranks),
        "tasks_per_s": tasks / wall if wall > 0 else float("nan"),
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(path)
