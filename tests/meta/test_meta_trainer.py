"""The G-Meta trainer: 1, 2 and 4 ranks train the same model, the naive baseline too, and a rank that dies
mid-run leaves a checkpoint that resumes on a different number of ranks to the same result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from meta_dist_helpers import run_ranks  # noqa: E402

from gpufleet.meta.checkpoint import latest_checkpoint, load_exported  # noqa: E402
from gpufleet.meta.prepare import PrepareConfig, prepare_file  # noqa: E402
from gpufleet.meta.trainer import MetaTrainer, TrainConfig  # noqa: E402

STEPS = 12


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """60 users x 30 rated items with a per-user taste for one of 4 item groups, prepared as tasks."""
    rng = np.random.default_rng(3)
    folder = tmp_path_factory.mktemp("meta-trainer")
    users, per_user, items = 60, 30, 80
    rows = []
    for u in range(users):
        liked = u % 4
        for k, item in enumerate(rng.choice(items, per_user, replace=False)):
            p = 0.8 if item % 4 == liked else 0.3
            rows.append(f"{u},{item},{int(rng.random() < p)},{1000 * u + k},{item % 4}")
    csv = folder / "clicks.csv"
    csv.write_text("uid,iid,click,ts,group\n" + "\n".join(rows) + "\n")
    prepare_file(
        csv,
        {"user": "uid", "item": "iid", "label": "click", "time": "ts"},
        PrepareConfig(support_size=8, query_size=12, min_query=5),
        folder / "tasks",
        sparse=["group"],
    )
    return folder / "tasks"


def _config(tasks: Path, **kw) -> TrainConfig:
    base = dict(
        tasks=tasks,
        epochs=10,
        tasks_per_step=8,
        max_steps=STEPS,
        emb_dim=8,
        bottom=(16,),
        top=(16,),
        inner_lr=0.3,
        seed=1,
        prefetch=1,
        patience=None,
        support_weight=0.0,
    )
    base.update(kw)
    return TrainConfig(**base)


def _train(rank: int, world: int, tasks: Path, out: Path, trainer: str, kw: dict) -> None:
    del rank, world
    if trainer == "naive":
        from gpufleet.meta.naive import NaiveTrainer

        t = NaiveTrainer(_config(tasks, **kw))
    else:
        t = MetaTrainer(_config(tasks, **kw))
    t.fit()
    t.export(out)


def _same_model(a: Path, b: Path, atol: float = 2e-6) -> None:
    ma, mb = load_exported(a), load_exported(b)
    assert torch.allclose(ma["table"], mb["table"], atol=atol)
    for name, value in ma["dense_state"].items():
        assert torch.allclose(value, mb["dense_state"][name], atol=atol), name


def _reference(tasks: Path, tmp_path: Path, **kw) -> Path:
    out = tmp_path / "one-rank.pt"
    _train(0, 1, tasks, out, "gmeta", kw)
    return out


@pytest.mark.parametrize("order", ["first", "second"])
def test_two_and_four_ranks_train_the_single_process_model(tasks, tmp_path, order):
    reference = _reference(tasks, tmp_path, order=order)
    before = load_exported(reference)
    fresh = MetaTrainer(_config(tasks))
    assert not torch.allclose(before["table"], fresh.embedding.full_table())  # training moved the table
    for world in (2, 4):
        out = tmp_path / f"{world}-ranks.pt"
        run_ranks(world, _train, tmp_path, tasks, out, "gmeta", {"order": order})
        _same_model(reference, out)


# every variant at once: decision layers adapted with learned rates, a task memory, the support loss, and the
# epochs chosen on the validation tasks (each rank scores them through the sharded table and stops alike)
VARIANT = {
    "adapt": "decision",
    "learned_rates": True,
    "memory": 8,
    "support_weight": 0.5,
    "patience": 1,
    "max_steps": None,
    "epochs": 4,
}


def test_every_variant_with_early_stopping_trains_the_same_model_on_two_ranks(tasks, tmp_path):
    reference = _reference(tasks, tmp_path, **VARIANT)
    out = tmp_path / "2-ranks.pt"
    run_ranks(2, _train, tmp_path, tasks, out, "gmeta", VARIANT)
    _same_model(reference, out)


def test_naive_baseline_trains_the_same_model(tasks, tmp_path):
    reference = _reference(tasks, tmp_path)
    out = tmp_path / "naive.pt"
    run_ranks(2, _train, tmp_path, tasks, out, "naive", {})
    _same_model(reference, out)


def test_a_rank_that_dies_leaves_a_checkpoint_that_resumes_on_fewer_ranks(tasks, tmp_path):
    ckpt = tmp_path / "ckpt"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "gpufleet.meta.worker",
        str(tasks),
        "--epochs",
        "10",
        "--tasks-per-step",
        "8",
        "--max-steps",
        str(STEPS),
        "--emb-dim",
        "8",
        "--bottom",
        "16",
        "--top",
        "16",
        "--inner-lr",
        "0.3",
        "--seed",
        "1",
        "--patience",
        "0",
        "--support-weight",
        "0",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "4",
        "--die-at-step",
        "7",
        "--die-rank",
        "1",
        "-o",
        str(tmp_path / "never.pt"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=240)
    assert done.returncode != 0
    assert not (tmp_path / "never.pt").exists()
    latest = latest_checkpoint(ckpt)
    assert latest is not None and latest.name.endswith("00000004")
    resumed = MetaTrainer(_config(tasks, checkpoint_dir=ckpt, resume=True))
    stats = resumed.fit()
    assert stats.start_step == 4 and resumed.step == STEPS and stats.steps == STEPS - 4
    out = tmp_path / "resumed.pt"
    resumed.export(out)
    _same_model(_reference(tasks, tmp_path), out, atol=1e-5)


def test_train_entry_point_reports_a_bad_folder_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet.meta.worker", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and "missing" in done.stderr and "Traceback" not in done.stderr


# every test here launches ranks (torchrun or gloo processes): one such test at a time across xdist workers
pytestmark = pytest.mark.multiprocess


def test_early_stopping_keeps_the_best_validation_epoch(tasks, tmp_path):
    trainer = MetaTrainer(_config(tasks, max_steps=None, epochs=8, patience=2, outer_lr=0.05, emb_lr=0.5))
    stats = trainer.fit()
    scores = [h["score"] for h in stats.val_history]
    assert [h["epoch"] for h in stats.val_history] == list(range(1, len(scores) + 1))
    assert stats.best_score == max(scores) and scores[stats.best_epoch - 1] == max(scores)
    # it stopped `patience` epochs after the best one, or ran out of epochs
    assert len(scores) == min(8, stats.best_epoch + 2)
    again = trainer.validate()  # the kept weights are the best epoch's
    assert again.auc == pytest.approx(stats.val_history[stats.best_epoch - 1]["auc"], abs=1e-9)


def test_early_stopping_needs_a_validation_split(tasks, tmp_path):
    import shutil

    from gpufleet.errors import MetaError

    bare = tmp_path / "bare"
    shutil.copytree(tasks, bare)
    (bare / "val.parquet").unlink()
    with pytest.raises(MetaError, match=r"val\.parquet"):
        MetaTrainer(_config(bare, patience=2))
    MetaTrainer(_config(bare, patience=None)).fit()  # selection off: no validation split needed
