"""Checkpoints reshard across world sizes, survive a rank dying mid-save, and name the file that is corrupt."""

from __future__ import annotations

import datetime
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from meta_dist_helpers import run_ranks

from gpufleet.errors import MetaError
from gpufleet.meta import checkpoint
from gpufleet.meta.checkpoint import (
    export_model,
    latest_checkpoint,
    load_checkpoint,
    load_exported,
    save_checkpoint,
)
from gpufleet.meta.embedding import ShardedEmbedding

NUM_ROWS, DIM = 29, 4


def train(emb: ShardedEmbedding, rank: int, world: int, step: int) -> None:
    """One sharded update with rank-dependent ids, so weights and Adagrad state differ from their init."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(0, NUM_ROWS, (3 + 2 * rank,), generator=gen)
    emb.zero_grad()
    (emb.lookup(ids) ** 2).sum().backward()
    emb.step(0.1)


def save(ckpt: Path, emb: ShardedEmbedding, step: int) -> Path:
    dense = {"w": torch.arange(3.0) + step}
    return save_checkpoint(
        ckpt,
        step,
        embedding=emb,
        dense_state=dense,
        optimizer_state={"lr": 0.1},
        extra={"epoch": step // 2, "step": step, "rng": torch.get_rng_state()},
    )


def expect(ckpt: Path, emb: ShardedEmbedding, step: int) -> None:
    """Rank 0 records the full table and Adagrad state that checkpoint ``step`` must restore."""
    table, acc = emb.full_table(), emb.full_adagrad_sum()
    if emb.rank == 0:
        torch.save({"table": table, "acc": acc}, ckpt / f"expect-{step}.pt")


def assert_restored(ckpt: Path, emb: ShardedEmbedding, step: int) -> None:
    want = torch.load(ckpt / f"expect-{step}.pt")
    assert torch.equal(emb.full_table(), want["table"]) and torch.equal(emb.full_adagrad_sum(), want["acc"])


def save_on_two(rank: int, world: int, ckpt: Path) -> None:
    emb = ShardedEmbedding(NUM_ROWS, DIM, seed=5)
    for step in (1, 2, 3):
        train(emb, rank, world, step)
        expect(ckpt, emb, step)
        assert save(ckpt, emb, step) == ckpt / f"step-{step:08d}"


def die_while_saving(rank: int, world: int, ckpt: Path) -> None:
    """Resume on 2 ranks; rank 1 exits right after writing its shard of step 4, before anything is published."""
    emb = ShardedEmbedding(NUM_ROWS, DIM, seed=6)
    assert load_checkpoint(ckpt, embedding=emb)[0] == 3
    train(emb, rank, world, 4)
    write = checkpoint._write_shard

    def write_then_die(tmp: Path, embedding: ShardedEmbedding) -> None:
        write(tmp, embedding)
        if rank == 1:
            os._exit(3)

    checkpoint._write_shard = write_then_die
    save(ckpt, emb, 4)


def resume_on_three(rank: int, world: int, ckpt: Path) -> None:
    emb = ShardedEmbedding(NUM_ROWS, DIM, seed=7)
    step, dense, opt, extra = load_checkpoint(latest_checkpoint(ckpt), embedding=emb)
    assert (step, opt, extra["epoch"]) == (3, {"lr": 0.1}, 1) and torch.equal(dense["w"], torch.arange(3.0) + 3)
    assert_restored(ckpt, emb, 3)
    train(emb, rank, world, 5)
    expect(ckpt, emb, 5)
    save(ckpt, emb, 5)
    export_model(ckpt / "model.pt", embedding=emb, dense_state={"w": torch.ones(2)}, meta={"auc": 0.5})


def test_save_on_two_resume_on_three_and_one_after_a_crash(tmp_path: Path) -> None:
    run_ranks(2, save_on_two, tmp_path, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000003"]  # keep=2
    assert (tmp_path / "LATEST").read_text().strip() == "step-00000003"

    with pytest.raises((mp.ProcessExitedException, mp.ProcessRaisedException)):
        run_ranks(2, die_while_saving, tmp_path, tmp_path, timeout_s=10)
    assert (tmp_path / "tmp-step-00000004" / "shard-1-of-2.pt").exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000003"

    run_ranks(3, resume_on_three, tmp_path, tmp_path)
    assert not list(tmp_path.glob("tmp-*")), "the next save cleans an interrupted one"
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000003", "step-00000005"]
    assert sorted(p.name for p in (tmp_path / "step-00000005").iterdir()) == [
        "dense.pt",
        "manifest.json",
        "shard-0-of-3.pt",
        "shard-1-of-3.pt",
        "shard-2-of-3.pt",
    ]

    for step in (3, 5):  # saved by 2 and by 3 ranks, loaded by 1
        emb = ShardedEmbedding(NUM_ROWS, DIM, seed=8)
        assert load_checkpoint(tmp_path / f"step-{step:08d}", embedding=emb)[0] == step
        assert_restored(tmp_path, emb, step)
    model = load_exported(tmp_path / "model.pt")
    assert torch.equal(model["table"], torch.load(tmp_path / "expect-5.pt")["table"])
    assert model["meta"] == {"auc": 0.5} and torch.equal(model["dense_state"]["w"], torch.ones(2))


@pytest.fixture
def two_steps(tmp_path: Path) -> tuple[Path, ShardedEmbedding]:
    """A one-rank checkpoint dir with steps 1 and 2."""
    emb = ShardedEmbedding(NUM_ROWS, DIM, seed=1)
    for step in (1, 2):
        train(emb, 0, 1, step)
        save(tmp_path, emb, step)
    return tmp_path, emb


def test_crash_before_publish_keeps_previous(two_steps, monkeypatch) -> None:
    ckpt, emb = two_steps
    monkeypatch.setattr(checkpoint, "_publish", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        save(ckpt, emb, 3)
    assert (ckpt / "tmp-step-00000003" / "shard-0-of-1.pt").exists()
    assert latest_checkpoint(ckpt) == ckpt / "step-00000002"
    monkeypatch.undo()
    save(ckpt, emb, 3)
    assert not list(ckpt.glob("tmp-*")) and latest_checkpoint(ckpt) == ckpt / "step-00000003"
    train(emb, 0, 1, 4)
    save(ckpt, emb, 3)  # the same step again (a resumed run) replaces it
    assert sorted(p.name for p in ckpt.iterdir()) == ["LATEST", "step-00000002", "step-00000003"]
    fresh = ShardedEmbedding(NUM_ROWS, DIM, seed=9)
    assert load_checkpoint(ckpt, embedding=fresh)[0] == 3 and torch.equal(fresh.weight, emb.weight)


def test_stale_or_missing_latest_falls_back(two_steps) -> None:
    ckpt, _ = two_steps
    (ckpt / "LATEST").write_text("step-00000007\n")
    assert latest_checkpoint(ckpt) == ckpt / "step-00000002"
    (ckpt / "LATEST").unlink()
    assert latest_checkpoint(ckpt) == ckpt / "step-00000002"
    assert latest_checkpoint(ckpt / "nothing-here") is None


def test_truncated_or_corrupt_file_is_named(two_steps) -> None:
    ckpt, _ = two_steps
    shard = ckpt / "step-00000002" / "shard-0-of-1.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert latest_checkpoint(ckpt) == ckpt / "step-00000001", "a truncated checkpoint is skipped"
    emb = ShardedEmbedding(NUM_ROWS, DIM)
    with pytest.raises(MetaError, match=r"shard-0-of-1\.pt is truncated"):
        load_checkpoint(ckpt / "step-00000002", embedding=emb)
    mid = len(data) // 2  # a flipped bit torch.load would not notice
    shard.write_bytes(data[:mid] + bytes([data[mid] ^ 1]) + data[mid + 1 :])
    with pytest.raises(MetaError, match=r"shard-0-of-1\.pt is corrupt \(sha256"):
        load_checkpoint(ckpt / "step-00000002", embedding=emb)
    shard.write_bytes(bytes(len(data)))
    with pytest.raises(MetaError, match=r"shard-0-of-1\.pt cannot be read"):
        load_checkpoint(ckpt / "step-00000002", embedding=emb, verify=False)
    (ckpt / "step-00000001" / "manifest.json").write_text("{not json")
    with pytest.raises(MetaError, match=r"step-00000001/manifest\.json cannot be read"):
        load_checkpoint(ckpt / "step-00000001", embedding=emb)
    (ckpt / "step-00000002" / "manifest.json").unlink()
    with pytest.raises(MetaError, match=r"step-00000002/manifest\.json is missing"):
        load_checkpoint(ckpt / "step-00000002", embedding=emb)
    assert latest_checkpoint(ckpt) is None
    with pytest.raises(MetaError, match="holds no complete checkpoint"):
        load_checkpoint(ckpt, embedding=emb)


def test_shape_mismatch_names_manifest(two_steps) -> None:
    ckpt, _ = two_steps
    with pytest.raises(
        MetaError,
        match=r"manifest\.json: the saved embedding table is num_rows=29 x dim=4 but "
        r"this model expects num_rows=30 x dim=4",
    ):
        load_checkpoint(ckpt, embedding=ShardedEmbedding(NUM_ROWS + 1, DIM))


def test_export_round_trip_and_bad_file(tmp_path: Path) -> None:
    emb = ShardedEmbedding(NUM_ROWS, DIM, seed=2)
    path = export_model(
        tmp_path / "out" / "model.pt", embedding=emb, dense_state={"b": torch.zeros(1)}, meta={"features": ["user"]}
    )
    model = load_exported(path)
    assert torch.equal(model["table"], emb.weight.detach()) and model["meta"] == {"features": ["user"]}
    path.write_bytes(b"garbage")
    with pytest.raises(MetaError, match=r"model\.pt cannot be read"):
        load_exported(path)
    torch.save({"format": "other"}, path)
    with pytest.raises(MetaError, match=r"model\.pt is not a gpufleet meta model"):
        load_exported(path)


class WritesFile:
    """Unpickling this calls ``open(path, "w")``: a payload that creates a file, as an attacker's would."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def test_a_crafted_pickle_in_a_checkpoint_or_model_never_runs(two_steps, tmp_path: Path) -> None:
    ckpt, emb = two_steps
    marker = tmp_path / "ran"
    # the control: unpickling the payload does create its file, so its absence below means it never ran
    pickle.loads(pickle.dumps(WritesFile(tmp_path / "control"))).close()
    assert (tmp_path / "control").exists()
    step = ckpt / "step-00000002"
    for name in ("dense.pt", "shard-0-of-1.pt"):
        target = step / name
        torch.save({"dense_state": WritesFile(marker), "optimizer_state": {}, "extra": {}}, target)
        manifest = json.loads((step / "manifest.json").read_text())  # the manifest matches the crafted file
        manifest["files"][name] = {"size": target.stat().st_size, "sha256": checkpoint._sha256(target)}
        (step / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(MetaError, match=rf"{re.escape(name)} cannot be read \(UnpicklingError"):
            load_checkpoint(step, embedding=ShardedEmbedding(NUM_ROWS, DIM))
    exported = tmp_path / "model.pt"
    exported.write_bytes(pickle.dumps({"format": "gpufleet-meta-model", "table": WritesFile(marker)}))
    with pytest.raises(MetaError, match=r"model\.pt cannot be read \(UnpicklingError: Unsupported") as err:
        load_exported(exported)
    assert "\n" not in str(err.value) and "weights_only" not in str(err.value)
    assert not marker.exists()
    with pytest.raises(MetaError, match=r"checkpoint\['extra'\]\['when'\] is a datetime"):
        save_checkpoint(
            ckpt, 3, embedding=emb, dense_state={}, optimizer_state={}, extra={"when": datetime.datetime.now()}
        )


def test_meta_evaluate_refuses_a_crafted_model_in_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "model.pt"
    evil.write_bytes(pickle.dumps(WritesFile(marker)))
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "meta", "evaluate", str(evil), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode != 0 and not marker.exists()
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {evil} cannot be read (UnpicklingError: Unsupported")
