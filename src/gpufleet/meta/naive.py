"""The naive distributed MAML baseline (the paper's DMAML stand-in), in the same code base and on the same data.

What makes it naive, on purpose and as the issue describes: every rank holds the full embedding table; samples
come one at a time from a per-sample ``DataLoader`` with no task grouping (the trainer regroups them by task in
Python); each task runs its own inner loop in a Python loop; and every task's gradients (dense layers AND the
whole table) are all-reduced right after that task. The model, the optimisers, the tasks of each meta-step and
the hyper-parameters are the G-Meta trainer's, so both reach the same model up to float rounding.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from gpufleet.meta.comm import all_reduce_sum_
from gpufleet.meta.embedding import ShardedEmbedding
from gpufleet.meta.loader import TaskStore, plan_steps
from gpufleet.meta.maml import dense_params, task_loss
from gpufleet.meta.trainer import MetaTrainer, TrainConfig, TrainStats

Sample = tuple[int, int, np.ndarray, np.ndarray, float]  # (task, set 0=support 1=query, ids [F], dense [D], label)


class PerSampleDataset(Dataset):
    """This rank's samples one by one, in step order (tasks of step 0, then step 1, ...), no task grouping."""

    def __init__(self, store: TaskStore, task_order: list[int]) -> None:
        self.samples: list[Sample] = []
        for task in task_order:
            batch = store.batch(np.array([task]))
            ids = batch.unique_ids
            for which, (idx, dense, label, mask) in enumerate(
                (
                    (batch.sup_idx, batch.sup_dense, batch.sup_label, batch.sup_mask),
                    (batch.qry_idx, batch.qry_dense, batch.qry_label, batch.qry_mask),
                )
            ):
                for j in np.flatnonzero(mask[0]):
                    self.samples.append((task, which, ids[idx[0, j]], dense[0, j], float(label[0, j])))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        task, which, ids, dense, label = self.samples[i]
        return {
            "task": task,
            "set": which,
            "ids": torch.from_numpy(ids),
            "dense": torch.from_numpy(dense),
            "label": torch.tensor(label, dtype=torch.float32),
        }


def _single_rank_groups() -> Any:
    """A process group holding only this rank, so the 'sharded' table is in fact replicated in full."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    return groups[dist.get_rank()]


class NaiveTrainer(MetaTrainer):
    """DMAML-style: full replicated table, per-sample loading, per-task loop, all-reduce after every task."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)
        self.embedding = ShardedEmbedding(
            self.store.meta.num_rows, config.emb_dim, seed=config.seed, group=_single_rank_groups()
        )

    def export(self, path: Path) -> None:
        """Every rank holds the full table, so global rank 0 alone writes the model; the others wait."""
        if self.rank == 0:
            super().export(path)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def fit(self) -> TrainStats:
        cfg = self.config
        stats = TrainStats(rank=self.rank, world=self.world)
        self.timer.reset()
        meta = self.store.meta
        start = time.perf_counter()
        select = bool(cfg.patience) and self.val_store is not None
        for epoch in range(cfg.epochs):
            steps = plan_steps(self.store.sizes, cfg.tasks_per_step, self.world, cfg.seed, epoch)
            if cfg.max_steps is not None:
                steps = steps[: max(0, cfg.max_steps - self.step)]
            if not steps:
                break
            mine = [int(t) for step in steps for t in step[self.rank]]
            loader = DataLoader(PerSampleDataset(self.store, mine), batch_size=None, shuffle=False)
            samples = iter(loader)
            for step in steps:
                t0 = time.perf_counter()
                tasks = _collect_tasks(samples, step[self.rank], self.store.sizes, meta.num_sparse, meta.num_dense)
                stats.data_wait_s += time.perf_counter() - t0
                stats.final_loss = self._naive_step(tasks, max(len(r) for r in step))
                self.step += 1
                stats.steps += 1
                stats.tasks += len(tasks)
                stats.samples += sum(len(sup[2]) + len(qry[2]) for sup, qry in tasks)
            finished = len(steps) == len(plan_steps(self.store.sizes, cfg.tasks_per_step, self.world, cfg.seed, epoch))
            if select and finished and not self._end_of_epoch(epoch + 1, stats):
                break
        if select:
            self._restore_best()
        self._close_stats(stats, start)
        return stats

    def _naive_step(self, tasks: list[tuple[tuple[torch.Tensor, ...], ...]], slots: int) -> float:
        """One meta-step: per task, inner loop + query backward + all-reduce of every gradient."""
        table = self.embedding.weight
        params = dense_params(self.model)
        tensors = [*self.model.parameters(), table]
        total = [torch.zeros_like(t) for t in tensors]
        loss_sum = 0.0
        for slot in range(slots):  # every rank runs `slots` all-reduces, even when it has fewer tasks
            if slot < len(tasks):
                sup, qry = tasks[slot]
                loss = task_loss(self.model, params, table, sup, qry, self.maml) / self.config.tasks_per_step
                grads = torch.autograd.grad(loss, tensors, allow_unused=True)
                grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, tensors, strict=True)]
                loss_sum += float(loss.detach())
            else:
                grads = [torch.zeros_like(t) for t in tensors]
            all_reduce_sum_(grads)
            for acc, g in zip(total, grads, strict=True):
                acc += g
        for p, g in zip(tensors, total, strict=True):
            p.grad = g
        self._apply_updates()
        return loss_sum


def _collect_tasks(
    samples: Any, task_ids: np.ndarray, sizes: np.ndarray, num_sparse: int, num_dense: int
) -> list[tuple[tuple[torch.Tensor, ...], ...]]:
    """Pull this step's samples off the per-sample loader and regroup them by task and set, in Python."""
    wanted = [int(t) for t in task_ids]
    grouped: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for _ in range(int(sum(sizes[t] for t in wanted))):
        sample = next(samples)
        grouped[int(sample["task"])][int(sample["set"])].append(sample)
    out = []
    for task in wanted:
        sets = []
        for which in (0, 1):
            rows = grouped[task][which]
            if rows:
                sets.append(
                    (
                        torch.stack([r["ids"] for r in rows]),
                        torch.stack([r["dense"] for r in rows]),
                        torch.stack([r["label"] for r in rows]),
                        torch.ones(len(rows), dtype=torch.bool),
                    )
                )
            else:
                sets.append(
                    (
                        torch.zeros(0, num_sparse, dtype=torch.long),
                        torch.zeros(0, num_dense),
                        torch.zeros(0),
                        torch.zeros(0, dtype=torch.bool),
                    )
                )
        out.append(tuple(sets))
    return out
