"""An RL model given with ``--opt rl.model=...`` is read as data: a crafted pickle in it never runs."""

from __future__ import annotations

import base64
import io
import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from gpufleet.errors import ConfigError
from gpufleet.sched.rl import default_model_path, load_model
from gpufleet.sched.rl_model import read_actor


class WritesFile:
    """Unpickling this calls ``open(path, "w")``: a payload that creates a file, as an attacker's would."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _shipped() -> dict[str, bytes]:
    with zipfile.ZipFile(default_model_path()) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _write(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _payload_in_data(path: Path, marker: Path) -> Path:
    """The shipped model with its observation space's pickle (which stable-baselines3 unpickles) replaced."""
    members = _shipped()
    data = json.loads(members["data"])
    data["observation_space"][":serialized:"] = base64.b64encode(pickle.dumps(WritesFile(marker))).decode()
    return _write(path, {**members, "data": json.dumps(data).encode()})


def _payload_in_weights(path: Path, marker: Path) -> Path:
    return _write(path, {**_shipped(), "policy.pth": pickle.dumps({"action_net.weight": WritesFile(marker)})})


def test_the_crafted_payload_is_live_for_stable_baselines3(tmp_path: Path) -> None:
    """The control: stable-baselines3's own load runs the payload, so its absence below means gpufleet's did not."""
    from sb3_contrib import MaskablePPO

    control = tmp_path / "ran"
    with pytest.raises(ValueError, match="not a Gymnasium space"):
        MaskablePPO.load(str(_payload_in_data(tmp_path / "m.zip", control)))
    assert control.exists()


def test_a_pickle_in_the_data_is_never_read_and_the_weights_are_the_shipped_ones(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    actor = read_actor(_payload_in_data(tmp_path / "m.zip", marker))
    shipped = load_model(None)
    assert all(np.array_equal(a, b) for a, b in zip(actor.weights, shipped.weights, strict=True))
    assert actor.activation == shipped.activation == "tanh" and not marker.exists()


def test_a_pickle_in_the_weights_is_refused_in_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = _payload_in_weights(tmp_path / "m.zip", marker)
    with pytest.raises(ConfigError, match=r"m\.zip: its policy\.pth is not a plain state dict \(UnpicklingError") as e:
        read_actor(path)
    assert "\n" not in str(e.value) and "weights_only" not in str(e.value) and not marker.exists()


def _corrupt(path: Path) -> Path:
    """The shipped model with its ``data`` deflated and the deflate stream then damaged (zlib refuses it)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in _shipped().items():
            zf.writestr(name, data)
        info = zf.getinfo("data")
    raw = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start : start + 64] = b"\xff" * 64  # a block of the reserved type 3
    path.write_bytes(bytes(raw))
    return path


def test_a_damaged_zip_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _corrupt(tmp_path / "bad.zip")
    with pytest.raises(ConfigError, match=r"bad\.zip: not a stable-baselines3 model zip \(zlib\.error: .*invalid") as e:
        read_actor(path)
    assert "\n" not in str(e.value)


def test_a_zip_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf, zf.open("data", "w") as f:
        for _ in range(17):
            f.write(b" " * 2**20)
    assert path.stat().st_size < 2**20
    with pytest.raises(ConfigError, match=r"its data expands to 17\.0 MiB, over the 16\.0 MiB limit"):
        read_actor(path)


def test_compressed_tensors_in_the_weights_are_refused(tmp_path: Path) -> None:
    """torch.save stores its tensors uncompressed: a deflated member could expand far past the file's size."""
    with zipfile.ZipFile(io.BytesIO(_shipped()["policy.pth"])) as zf:
        inner = {name: zf.read(name) for name in zf.namelist()}
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in inner.items():
            zf.writestr(name, data)
    path = _write(tmp_path / "m.zip", {**_shipped(), "policy.pth": packed.getvalue()})
    with pytest.raises(ConfigError, match=r"its policy\.pth has compressed members"):
        read_actor(path)


@pytest.mark.parametrize("kind", ["pickle", "damaged"])
def test_the_command_line_refuses_a_crafted_rl_model(kind: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = _payload_in_weights(tmp_path / "evil.zip", marker) if kind == "pickle" else _corrupt(tmp_path / "evil.zip")
    trace = tmp_path / "jobs.csv"
    pl.DataFrame(
        {"job_id": ["a", "b"], "submit_s": [0.0, 60.0], "duration_s": [3600.0, 600.0], "num_gpus": [8, 2]}
    ).write_csv(trace)
    args = [
        "simulate",
        "--trace",
        str(trace),
        "--policy",
        "rl",
        "--network",
        "--opt",
        f"rl.model={path}",
        "--no-progress",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert res.returncode != 0 and not marker.exists()
    assert "Traceback" not in res.stderr + res.stdout
    last = res.stderr.strip().splitlines()[-1]
    if kind == "pickle":
        assert last.startswith(f"error: cannot load RL model {path}: its policy.pth is not a plain state dict")
    else:
        assert last.startswith(f"error: cannot load RL model {path}: not a stable-baselines3 model zip (zlib.error:")
