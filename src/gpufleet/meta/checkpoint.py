"""Crash-safe, resharding checkpoints of a sharded embedding plus the replicated dense model, and model export.

Layout of ``ckpt_dir``::

    step-00000120/                    a complete checkpoint (it has manifest.json)
        shard-{rank}-of-{world}.pt    global row ids, rows and Adagrad state of one rank
        dense.pt                      dense model and optimizer state, extra (epoch, step, config, rng, ...): tensors
                                      and plain values only, read back with torch.load(weights_only=True)
        manifest.json                 written last: world, step, table shape, size and sha256 of every file
    LATEST                            name of the newest complete step directory (a hint, replaced atomically)
    tmp-step-00000130/                a save in progress or interrupted: ignored, removed by the next save

A save writes into ``tmp-step-*``, then rank 0 writes the manifest and renames the directory, so a rank dying at
any point leaves the previous complete checkpoint in place. Loading keeps the rows each rank owns under the
*current* world (``id % world == rank``), so a run may resume on a different number of ranks. ``ckpt_dir`` must
be visible to every rank (one node, or a shared file system).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpufleet.errors import MetaError
from gpufleet.meta.embedding import ShardedEmbedding
from gpufleet.safeload import load_torch_weights, why_unreadable

FORMAT = "gpufleet-meta-checkpoint"
MODEL_FORMAT = "gpufleet-meta-model"
VERSION = 1
MANIFEST = "manifest.json"
DENSE = "dense.pt"
LATEST = "LATEST"
STEP_RE = re.compile(r"^step-(\d{8,})$")
DIGEST_SUFFIX = ".digest.json"
_CHUNK = 1 << 22


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def shard_name(rank: int, world: int) -> str:
    return f"shard-{rank}-of-{world}.pt"


# ------------------------------------------------------------------------------------------------ save
def save_checkpoint(
    ckpt_dir: str | Path,
    step: int,
    *,
    embedding: ShardedEmbedding,
    dense_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    extra: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` of every rank into ``ckpt_dir`` (collective: all ranks call it); returns its dir.

    Rank 0 also writes the dense state (it is replicated), publishes the checkpoint atomically and then deletes
    all but the newest ``keep`` complete checkpoints older than this one.
    """
    if keep < 1:
        raise MetaError(f"keep={keep}: a checkpoint directory must keep at least 1 checkpoint; pass keep >= 1")
    payload = {"step": step, "dense_state": dense_state, "optimizer_state": optimizer_state, "extra": extra}
    _check_plain(payload, "checkpoint")
    root = Path(ckpt_dir)
    tmp = root / f"tmp-{step_dir_name(step)}"
    if embedding.rank == 0:
        _prepare_tmp(root, tmp)
    _barrier(embedding)
    _write_shard(tmp, embedding)
    if embedding.rank == 0:
        _write_with_digest(tmp / DENSE, payload)
    _barrier(embedding)
    if embedding.rank == 0:
        _publish(root, tmp, step, embedding, keep)
    _barrier(embedding)
    return root / step_dir_name(step)


_PLAIN = (str, int, float, bool, type(None), torch.Tensor, torch.Size, torch.dtype, torch.device)


def _check_plain(value: Any, where: str) -> None:
    """MetaError unless ``value`` holds only what ``torch.load(weights_only=True)`` reads back (tensors, numbers,
    strings and containers of them): a checkpoint must load without unpickling arbitrary objects."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, where)
            _check_plain(v, f"{where}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
    elif not isinstance(value, _PLAIN):
        raise MetaError(
            f"{where} is a {type(value).__name__}: a checkpoint holds only tensors, numbers, strings and "
            "lists or dicts of them (convert it, e.g. with .tolist() or str())"
        )


def _barrier(embedding: ShardedEmbedding) -> None:
    if embedding.world > 1:
        dist.barrier(group=embedding.group)


def _prepare_tmp(root: Path, tmp: Path) -> None:
    """Remove what interrupted saves left behind (tmp-* and old-* dirs), then create an empty ``tmp``."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in [*root.glob("tmp-step-*"), *root.glob("old-step-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()


def _write_shard(tmp: Path, embedding: ShardedEmbedding) -> None:
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "rank": embedding.rank,
        "world": embedding.world,
        "num_rows": embedding.num_rows,
        "dim": embedding.dim,
        "ids": embedding.global_ids(),
        "weight": embedding.weight.detach().cpu(),
        "adagrad_sum": embedding.adagrad_sum.detach().cpu(),
    }
    _write_with_digest(tmp / shard_name(embedding.rank, embedding.world), payload)


def _write_with_digest(path: Path, payload: dict[str, Any]) -> None:
    """``torch.save`` + fsync, then a sidecar with the file's size and sha256 for rank 0's manifest."""
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    digest = {"size": path.stat().st_size, "sha256": _sha256(path)}
    _write_text(path.with_name(path.name + DIGEST_SUFFIX), json.dumps(digest))


def _publish(root: Path, tmp: Path, step: int, embedding: ShardedEmbedding, keep: int) -> None:
    """Rank 0: manifest into ``tmp``, rename it to ``step-*``, point LATEST at it, prune old checkpoints."""
    names = [shard_name(r, embedding.world) for r in range(embedding.world)] + [DENSE]
    files = {}
    for name in names:
        sidecar = tmp / (name + DIGEST_SUFFIX)
        files[name] = json.loads(sidecar.read_text())
        sidecar.unlink()
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        "world": embedding.world,
        "num_rows": embedding.num_rows,
        "dim": embedding.dim,
        "shards": names[:-1],
        "files": files,
        "saved_at": time.time(),
    }
    _write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
    final = root / step_dir_name(step)
    if final.exists():  # saving a step again (e.g. after a resume): move the old copy aside first
        trash = root / f"old-{final.name}"
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
    os.replace(tmp, final)
    _fsync_dir(root)
    _write_text(root / LATEST, final.name + "\n")
    _prune(root, step, keep)


def _prune(root: Path, step: int, keep: int) -> None:
    """Delete complete checkpoints older than ``step`` beyond the newest ``keep`` (this one included)."""
    older = sorted(s for s, d in _step_dirs(root) if s < step)
    for s in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(root / step_dir_name(s), ignore_errors=True)
    for trash in root.glob("old-step-*"):
        shutil.rmtree(trash, ignore_errors=True)


def _write_text(path: Path, text: str) -> None:
    """Atomically replace ``path`` (write a temporary file, fsync, ``os.replace``)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ find
def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), d) for d in root.iterdir() if d.is_dir() and (m := STEP_RE.match(d.name))]
    return sorted(found)


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The complete checkpoint LATEST names, else the newest complete ``step-*`` dir, else None.

    Complete means: the manifest parses and every file it lists exists with the recorded size (contents are
    checked against sha256 by ``load_checkpoint``).
    """
    root = Path(ckpt_dir)
    if not root.is_dir():
        return None
    try:
        hint = root / (root / LATEST).read_text().strip()
    except OSError:
        hint = None
    if hint is not None and STEP_RE.match(hint.name) and _is_complete(hint):
        return hint
    for _, d in reversed(_step_dirs(root)):
        if _is_complete(d):
            return d
    return None


def _is_complete(step_dir: Path) -> bool:
    try:
        manifest = _read_manifest(step_dir)
        for name, entry in manifest["files"].items():
            _check_size(step_dir / name, entry)
    except MetaError:
        return False
    return True


def _read_manifest(step_dir: Path) -> dict[str, Any]:
    path = step_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise MetaError(
            f"{path} is missing: {step_dir} is not a complete checkpoint; resume from "
            "latest_checkpoint(<checkpoint dir>) instead"
        ) from None
    except (OSError, ValueError) as exc:
        raise MetaError(
            f"{path} cannot be read ({exc}); resume from an earlier checkpoint or delete {step_dir}"
        ) from None
    if not _manifest_ok(manifest):
        raise MetaError(
            f"{path} is not a valid gpufleet meta checkpoint manifest (format {FORMAT!r}, step, world, "
            "num_rows, dim, shards, files with size and sha256); point at a step-* directory written "
            "by save_checkpoint, or resume from an earlier one"
        )
    return manifest


def _manifest_ok(manifest: Any) -> bool:
    keys = {"format", "step", "world", "num_rows", "dim", "shards", "files"}
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not keys <= manifest.keys():
        return False
    files = manifest["files"]
    names = [*manifest["shards"], DENSE] if isinstance(manifest["shards"], list) else None
    return (
        isinstance(files, dict)
        and names is not None
        and len(manifest["shards"]) == manifest["world"]
        and all(
            isinstance(files.get(n), dict)
            and isinstance(files[n].get("size"), int)
            and isinstance(files[n].get("sha256"), str)
            for n in names
        )
    )


def _check_size(path: Path, entry: dict[str, Any]) -> None:
    try:
        size = path.stat().st_size
    except OSError:
        raise MetaError(f"{path} is missing from its checkpoint; resume from an earlier checkpoint") from None
    if size != entry["size"]:
        raise MetaError(
            f"{path} is truncated or corrupt ({size} bytes, manifest says {entry['size']}); resume "
            "from an earlier checkpoint"
        )


def _check_file(path: Path, entry: dict[str, Any], verify: bool) -> None:
    _check_size(path, entry)
    if verify and _sha256(path) != entry["sha256"]:
        raise MetaError(f"{path} is corrupt (sha256 differs from the manifest); resume from an earlier checkpoint")


# ------------------------------------------------------------------------------------------------ load
def load_checkpoint(
    path: str | Path, *, embedding: ShardedEmbedding, verify: bool = True
) -> tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Restore ``embedding`` (any world size) from a step dir, or from a checkpoint dir's latest checkpoint.

    Returns ``(step, dense_state, optimizer_state, extra)``. Each rank reads every shard and keeps the rows it
    owns now; ``verify`` checks every file's sha256 first. Local: no collective.
    """
    step_dir = _resolve(Path(path))
    manifest = _read_manifest(step_dir)
    _check_shape(step_dir / MANIFEST, manifest, embedding)
    filled = torch.zeros(embedding.num_local, dtype=torch.bool)
    for name in manifest["shards"]:
        _check_file(step_dir / name, manifest["files"][name], verify)
        _load_shard(step_dir / name, embedding, filled)
    if not bool(filled.all()):
        raise MetaError(
            f"{step_dir} lacks {int((~filled).sum())} of rank {embedding.rank}'s rows; the checkpoint "
            "is incomplete: resume from an earlier one"
        )
    _check_file(step_dir / DENSE, manifest["files"][DENSE], verify)
    dense = _torch_load(step_dir / DENSE)
    if not {"dense_state", "optimizer_state", "extra"} <= dense.keys():
        raise MetaError(
            f"{step_dir / DENSE} lacks dense_state, optimizer_state or extra; the file is corrupt: "
            "resume from an earlier checkpoint"
        )
    return int(manifest["step"]), dense["dense_state"], dense["optimizer_state"], dense["extra"]


def _resolve(path: Path) -> Path:
    if (path / MANIFEST).exists() or STEP_RE.match(path.name):
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise MetaError(
            f"{path} holds no complete checkpoint (no step-* directory with a valid {MANIFEST}); "
            "check the path or start without resuming"
        )
    return found


def _check_shape(manifest_path: Path, manifest: dict[str, Any], embedding: ShardedEmbedding) -> None:
    saved, expected = (manifest["num_rows"], manifest["dim"]), (embedding.num_rows, embedding.dim)
    if tuple(saved) != expected:
        raise MetaError(
            f"{manifest_path}: the saved embedding table is num_rows={saved[0]} x dim={saved[1]} but "
            f"this model expects num_rows={expected[0]} x dim={expected[1]}; resume with the same "
            "prepared folder and embedding dim, or use a new checkpoint directory"
        )


def _load_shard(path: Path, embedding: ShardedEmbedding, filled: torch.Tensor) -> None:
    """Copy the rows of one saved shard that this rank owns under the current world."""
    data = _torch_load(path, mmap=True)
    ids, weight, acc = data.get("ids"), data.get("weight"), data.get("adagrad_sum")
    n = ids.shape[0] if isinstance(ids, torch.Tensor) and ids.dim() == 1 else -1
    shape = (n, embedding.dim)
    if n < 0 or not all(isinstance(t, torch.Tensor) and tuple(t.shape) == shape for t in (weight, acc)):
        raise MetaError(
            f"{path} does not hold ids [n] with weight and adagrad_sum [n, {embedding.dim}]; the file "
            "is corrupt: resume from an earlier checkpoint"
        )
    mine = ids % embedding.world == embedding.rank
    local = ids[mine] // embedding.world
    with torch.no_grad():
        embedding.weight[local.to(embedding.weight.device)] = weight[mine].to(embedding.weight)
        embedding.adagrad_sum[local.to(embedding.weight.device)] = acc[mine].to(embedding.adagrad_sum)
    filled[local] = True


def _torch_load(path: Path, *, mmap: bool = False) -> dict[str, Any]:
    """``torch.load`` of tensors and plain values only (``weights_only``): a file never runs code when read."""
    try:
        data = load_torch_weights(path, mmap=mmap)
    except FileNotFoundError:
        raise MetaError(f"{path} is missing; resume from an earlier checkpoint") from None
    except Exception as exc:  # torch.load raises RuntimeError, UnpicklingError, EOFError, ... on bad files
        raise MetaError(
            f"{path} cannot be read ({why_unreadable(exc)}); the file is corrupt or not "
            "written by gpufleet: resume from an earlier checkpoint or re-export"
        ) from None
    if not isinstance(data, dict):
        raise MetaError(f"{path} does not hold a dict; it was not written by gpufleet")
    return data


# ---------------------------------------------------------------------------------------------- export
def export_model(
    path: str | Path, *, embedding: ShardedEmbedding, dense_state: dict[str, Any], meta: dict[str, Any]
) -> Path:
    """Write one file with the full table, the dense state and JSON-able ``meta`` (collective; rank 0 writes)."""
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"export_model: meta must be JSON-serialisable ({exc})") from None
    table = embedding.full_table().cpu()
    path = Path(path)
    if embedding.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(
            {
                "format": MODEL_FORMAT,
                "version": VERSION,
                "num_rows": embedding.num_rows,
                "dim": embedding.dim,
                "table": table,
                "dense_state": dense_state,
                "meta": meta,
            },
            tmp,
        )
        os.replace(tmp, path)
    _barrier(embedding)
    return path


def load_exported(path: str | Path) -> dict[str, Any]:
    """Read ``export_model``'s file: ``{"table", "dense_state", "meta", "num_rows", "dim", ...}`` on CPU."""
    path = Path(path)
    data = _torch_load(path)
    if data.get("format") != MODEL_FORMAT or not isinstance(data.get("table"), torch.Tensor):
        raise MetaError(
            f"{path} is not a gpufleet meta model (format {data.get('format')!r}); pass a file "
            "written by export_model (the train command's exported model)"
        )
    return data
