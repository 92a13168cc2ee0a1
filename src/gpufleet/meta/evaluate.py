"""Cold-start evaluation: adapt the model on each held-out task's support set (k-shot), score its query set.

The baseline is the plain (non-meta) DLRM trained on the same tasks with the same hyper-parameters; it scores
the query set as it is, and (``baseline_finetuned``) after the same k-shot fine-tuning steps as the meta model,
so that a reader sees what meta-learning adds beyond fine-tuning.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpufleet.errors import MetaError
from gpufleet.meta.checkpoint import load_exported
from gpufleet.meta.dense import ModelConfig, build_model
from gpufleet.meta.loader import TaskStore
from gpufleet.meta.maml import MamlConfig
from gpufleet.meta.metrics import RankingScores
from gpufleet.meta.scoring import score_store


@dataclass
class LoadedModel:
    """An exported model ready to score: dense module, full embedding table and the training's settings."""

    model: torch.nn.Module
    table: torch.Tensor
    maml: MamlConfig
    meta: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> LoadedModel:
        data = load_exported(path)
        table, dense_state, meta = data["table"], data["dense_state"], data["meta"]
        try:
            config = ModelConfig.from_json(meta["model"])
            maml = MamlConfig(**meta["maml"])
        except (KeyError, TypeError) as exc:
            raise MetaError(
                f"{path}: not a gpufleet meta model (missing {exc}); train one with `python -m gpufleet.meta.worker`"
            ) from exc
        model = build_model(config)
        model.load_state_dict(dense_state)
        model.eval()
        return cls(model=model, table=table, maml=maml, meta=meta)


def evaluate_model(
    loaded: LoadedModel, store: TaskStore, maml: MamlConfig | None = None, tasks_per_batch: int = 64
) -> RankingScores:
    """Pooled AUC, GAUC and NDCG@10 on ``store``'s tasks after k-shot adaptation with ``maml`` (default: as
    trained)."""
    maml = maml or loaded.maml
    if loaded.table.shape[0] != store.meta.num_rows:
        raise MetaError(
            f"the model's table has {loaded.table.shape[0]} rows but the tasks need "
            f"{store.meta.num_rows}: evaluate on the folder the model was trained on"
        )

    def rows_of(ids: np.ndarray) -> torch.Tensor:
        return loaded.table[torch.from_numpy(ids)]

    return score_store(loaded.model, rows_of, store, maml, tasks_per_batch)


def evaluate_with_baseline(model: LoadedModel, baseline: LoadedModel, store: TaskStore) -> dict[str, Any]:
    """The meta model after adaptation, and the plain model as it is and after the same fine-tuning."""
    adapt_like_meta = replace(model.maml, order="first") if model.maml.order != "none" else MamlConfig()
    result: dict[str, Any] = evaluate_model(model, store).to_json()
    result["baseline"] = evaluate_model(baseline, store, MamlConfig(order="none")).to_json()
    result["baseline_finetuned"] = evaluate_model(baseline, store, adapt_like_meta).to_json()
    result["adaptation"] = {
        "inner_lr": model.maml.inner_lr,
        "inner_steps": model.maml.inner_steps,
        "order": model.maml.order,
    }
    return result
