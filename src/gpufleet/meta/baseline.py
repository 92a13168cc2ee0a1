"""The plain (non-meta) model a meta model is compared with: the same DLRM trained on the same tasks with the
same settings, without the inner adaptation loop."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

__all__ = ["train_plain_baseline"]


def train_plain_baseline(loaded: Any, tasks: Path) -> Any:
    """Train the plain model for ``loaded`` (a :class:`gpufleet.meta.evaluate.LoadedModel`) on ``tasks``, in this
    process, and return it loaded the same way."""
    from gpufleet.meta.evaluate import LoadedModel
    from gpufleet.meta.trainer import MetaTrainer, TrainConfig

    train = dict(loaded.meta.get("train", {}))
    fields = set(TrainConfig.__dataclass_fields__)
    kwargs = {k: v for k, v in train.items() if k in fields and k not in ("tasks", "output", "checkpoint_dir")}
    kwargs.update(
        order="none", adapt="all", learned_rates=False, memory=0, resume=False, progress=False, die_at_step=None
    )
    for key in ("bottom", "top"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    trainer = MetaTrainer(TrainConfig(tasks=tasks, **kwargs))
    trainer.fit()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plain.pt"
        trainer.export(path)
        return LoadedModel.load(path)
