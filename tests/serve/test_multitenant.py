"""Tenants, keys and runtime adapters, driven with the official ``openai`` client against a real socket.

The auth matrix (no key, a bad key, another tenant's adapter, admin endpoints with a tenant key, path escapes on
load), the keys file's validation, adapters loaded and unloaded while serving (over the fake backend, the
placement front end and the real CPU engine), and the command line's refusal to serve the network without keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from gpufleet.errors import ServeError
from gpufleet.serve.fake_backend import FakeBackend
from gpufleet.serve.placement import PlacementFrontend
from gpufleet.serve.server import create_app
from gpufleet.serve.tenants import TenantRegistry, check_bind, hash_key, load_keys, parse_keys

KEY_A, KEY_B, KEY_ADMIN = "sk-tenant-a-0123456789", "sk-tenant-b-0123456789", "sk-admin-0123456789ab"
KEYS_TOML = f"""
[[tenant]]
name = "a"
key = "{KEY_A}"
adapters = ["support-*", "alpha"]

[[tenant]]
name = "b"
key_sha256 = "{hashlib.sha256(KEY_B.encode()).hexdigest()}"
adapters = ["beta"]
base_model = false

[[tenant]]
name = "ops"
key = "{KEY_ADMIN}"
adapters = ["*"]
admin = true
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app) -> Iterator[str]:
    """``app`` under uvicorn in a thread on a free port; yields the base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def oai(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20)


def adapter_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    return folder


@pytest.fixture
def registry() -> TenantRegistry:
    return parse_keys(KEYS_TOML, "keys.toml")


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "adapters"
    for name in ("support-v2", "gamma"):
        adapter_folder(root, name)
    return root


# -------------------------------------------------------------------------------------------- the keys file
def test_keys_are_kept_as_hashes_and_map_to_their_tenant(registry):
    assert [t.name for t in registry.tenants] == ["a", "b", "ops"]
    assert all(t.key_sha256 == hash_key(k) for t, k in zip(registry.tenants, (KEY_A, KEY_B, KEY_ADMIN), strict=True))
    assert KEY_A not in repr(registry.tenants)
    assert registry.authenticate(KEY_B).name == "b"
    assert registry.authenticate(KEY_B + "x") is None and registry.authenticate("") is None
    a = registry.authenticate(KEY_A)
    assert a.may_use("support-v9") and a.may_use("alpha") and a.may_use(None)
    assert not a.may_use("beta") and not a.may_use("support") and not registry.tenants[1].may_use(None)
    assert registry.queue_share == 0.5  # several tenants: none may hold more than half the queue


@pytest.mark.parametrize(
    "text, where",
    [
        ('[[tenant]]\nname = "a"\n', "tenant[0]: Value error, give exactly one of key or key_sha256"),
        (f'[[tenant]]\nname = "a"\nkey = "{KEY_A}"\nkey_sha256 = "{"0" * 64}"\n', "exactly one"),
        ('[[tenant]]\nname = "a"\nkey_sha256 = "xyz"\n', "tenant[0].key_sha256"),
        ('[[tenant]]\nname = "a"\nkey = "short"\n', "tenant[0].key"),
        (f'[[tenant]]\nname = "a"\nkey = "{KEY_A}"\nrequests_per_s = 0\n', "tenant[0].requests_per_s"),
        (f'[[tenant]]\nname = "a"\nkey = "{KEY_A}"\nadmn = true\n', "tenant[0].admn"),
        (f'[[tenant]]\nname = "a b"\nkey = "{KEY_A}"\n', "tenant[0].name"),
        (f'[[tenant]]\nname = "a"\nkey = "{KEY_A}"\n[[tenant]]\nname = "a"\nkey = "{KEY_B}"\n', "tenant[1].name"),
        (f'[[tenant]]\nname = "a"\nkey = "{KEY_A}"\n[[tenant]]\nname = "b"\nkey = "{KEY_A}"\n', "same key"),
        ("tenant = 3\n", "tenant"),
        ("[[tenant]\n", "not valid TOML"),
    ],
)
def test_a_bad_keys_file_names_the_file_and_the_field(tmp_path, text, where):
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(ServeError) as info:
        load_keys(path)
    assert str(path) in str(info.value) and where in str(info.value)


def test_missing_keys_file():
    with pytest.raises(ServeError, match=r"--api-keys /nowhere/keys\.toml: no such file"):
        load_keys("/nowhere/keys.toml")


def test_without_keys_only_loopback_is_served(registry):
    assert "127.0.0.1 only" in check_bind("127.0.0.1", None)
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        with pytest.raises(ServeError, match="without --api-keys"):
            check_bind(host, None)
    assert "3 tenant(s)" in check_bind("0.0.0.0", registry)


def test_the_cli_refuses_a_public_host_without_keys_in_one_line(tmp_path):
    env = {**os.environ, "COLUMNS": "400"}
    cmd = [sys.executable, "-m", "gpufleet.cli", "serve", "--base", "tiny-llama-random", "--host", "0.0.0.0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "without --api-keys" in result.stderr
    bad = tmp_path / "keys.toml"
    bad.write_text('[[tenant]]\nname = "x"\n')
    result = subprocess.run([*cmd, "--api-keys", str(bad)], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and str(bad) in result.stderr and "key_sha256" in result.stderr


# ------------------------------------------------------------------------------------------ the auth matrix
def test_auth_matrix_with_the_openai_client(registry, root):
    backend = FakeBackend(adapters=("alpha", "beta", "support-v1"))
    app = create_app(backend, tenants=registry, adapters_root=root)
    with serving(app) as url:
        # no key at all: 401 everywhere but /health
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("GET", "/metrics")]:
            r = httpx.request(method, url + path, json={"model": "alpha", "prompt": "x"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url + "/health").status_code == 200
        # a bad key
        with pytest.raises(openai.AuthenticationError):
            oai(url, "sk-not-a-key-at-all").models.list()
        with pytest.raises(openai.AuthenticationError):
            oai(url, KEY_A + "0").completions.create(model="alpha", prompt="x", max_tokens=2)
        # each key sees and uses only its own adapters
        a, b = oai(url, KEY_A), oai(url, KEY_B)
        assert [m.id for m in a.models.list()] == ["fake-base", "alpha", "support-v1"]
        assert [m.id for m in b.models.list()] == ["beta"]
        assert a.completions.create(model="support-v1", prompt="hi", max_tokens=3).choices[0].text == "hih"
        assert b.completions.create(model="beta", prompt="yo", max_tokens=2).choices[0].text == "yo"
        with pytest.raises(openai.PermissionDeniedError) as denied:
            a.completions.create(model="beta", prompt="x", max_tokens=2)
        assert "tenant 'a' may not use the adapter 'beta'" in denied.value.message
        with pytest.raises(openai.PermissionDeniedError):
            b.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        with pytest.raises(openai.PermissionDeniedError):  # b has no base model
            b.completions.create(model="fake-base", prompt="x", max_tokens=2)
        with pytest.raises(openai.PermissionDeniedError):  # outside a's globs: 403 whether or not it exists
            a.completions.create(model="no-such-thing", prompt="x", max_tokens=2)
        with pytest.raises(openai.NotFoundError):  # inside a's globs but not served: 404
            a.completions.create(model="support-v7", prompt="x", max_tokens=2)
        # admin endpoints with a tenant key: 403
        for method, path, body in [
            ("POST", "/v1/adapters", {"name": "gamma", "path": "gamma"}),
            ("DELETE", "/v1/adapters/alpha", None),
            ("GET", "/metrics", None),
            ("GET", "/v1/state", None),
        ]:
            r = httpx.request(method, url + path, json=body, headers={"Authorization": f"Bearer {KEY_A}"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only", (path, r.text)
        assert backend.adapters == ["alpha", "beta", "support-v1"]
        assert [m.id for m in oai(url, KEY_ADMIN).models.list()][1:] == ["alpha", "beta", "support-v1"]


def test_adapter_paths_cannot_leave_the_adapters_root(registry, root, tmp_path):
    outside = adapter_folder(tmp_path / "elsewhere", "evil")
    (root / "link-out").symlink_to(outside)
    (root / "link-in").symlink_to(root / "gamma")
    backend = FakeBackend()
    admin = {"Authorization": f"Bearer {KEY_ADMIN}"}
    with serving(create_app(backend, tenants=registry, adapters_root=root)) as url:

        def load(name: str, path: str) -> httpx.Response:
            return httpx.post(url + "/v1/adapters", json={"name": name, "path": path}, headers=admin)

        for path, says in [
            ("../elsewhere/evil", "'..' is not allowed"),
            ("gamma/../../elsewhere/evil", "'..' is not allowed"),
            (str(outside), "absolute path outside"),
            ("/etc", "absolute path outside"),
            ("link-out", "link that leads outside"),
            ("missing", "no PEFT adapter there"),
        ]:
            r = load("x", path)
            assert r.status_code == 400 and says in r.json()["error"]["message"], (path, r.text)
        assert load("bad/name", "gamma").status_code == 400
        assert load("fake-base", "gamma").status_code == 409
        assert backend.adapters == ["alpha", "beta"]
        # inside the root: relative, absolute, or through a link that stays inside
        assert load("g1", "gamma").status_code == 201
        assert load("g2", str(root / "gamma")).status_code == 201
        assert load("g3", "link-in").json() == {"name": "g3", "path": "gamma", "status": "loaded"}
        assert load("g1", "support-v2").status_code == 409
        assert backend.loaded_from == {name: (root / "gamma").resolve() for name in ("g1", "g2", "g3")}


def test_no_adapters_root_means_no_runtime_loading(registry):
    admin = {"Authorization": f"Bearer {KEY_ADMIN}"}
    with serving(create_app(FakeBackend(), tenants=registry)) as url:
        r = httpx.post(url + "/v1/adapters", json={"name": "g", "path": "g"}, headers=admin)
        assert r.status_code == 400 and "--adapters" in r.json()["error"]["message"]


# --------------------------------------------------------------------------------------- runtime adapters
def test_runtime_adapter_serves_then_unloads_after_in_flight_requests_finish(registry, root):
    backend = FakeBackend(delay=0.01)
    admin = {"Authorization": f"Bearer {KEY_ADMIN}"}
    with serving(create_app(backend, tenants=registry, adapters_root=root)) as url:
        a = oai(url, KEY_A)
        with pytest.raises(openai.NotFoundError):
            a.completions.create(model="support-v2", prompt="x", max_tokens=2)
        r = httpx.post(url + "/v1/adapters", json={"name": "support-v2", "path": "support-v2"}, headers=admin)
        assert r.status_code == 201
        assert "support-v2" in [m.id for m in a.models.list()]
        assert a.completions.create(model="support-v2", prompt="ok", max_tokens=4).choices[0].text == "okok"
        # a long stream is in flight when the adapter is deleted
        stream = a.completions.create(model="support-v2", prompt="abc", max_tokens=60, stream=True)
        pieces = [next(stream).choices[0].text]
        r = httpx.delete(url + "/v1/adapters/support-v2", headers=admin)
        assert r.status_code == 202 and r.json() == {"name": "support-v2", "status": "unloading", "in_flight": 1}
        with pytest.raises(openai.NotFoundError):
            a.completions.create(model="support-v2", prompt="x", max_tokens=2)
        assert "support-v2" not in [m.id for m in a.models.list()]
        assert "support-v2" in backend.adapters  # still loaded: a request uses it
        pieces += [event.choices[0].text for event in stream]
        assert "".join(pieces) == ("abc" * 20) and len(backend.finished) == 2
        deadline = time.monotonic() + 5
        while "support-v2" in backend.adapters and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "support-v2" not in backend.adapters
        # unloaded at once when idle, and a second delete is 404
        assert httpx.post(url + "/v1/adapters", json={"name": "g", "path": "gamma"}, headers=admin).status_code == 201
        assert httpx.delete(url + "/v1/adapters/g", headers=admin).json() == {"name": "g", "status": "unloaded"}
        assert httpx.delete(url + "/v1/adapters/g", headers=admin).status_code == 404
        assert backend.adapters == ["alpha", "beta"]


def test_runtime_adapters_reach_every_instance_behind_placement(registry, root):
    instances = {f"fake-{i}": FakeBackend(instance_id=f"fake-{i}") for i in range(2)}
    admin = {"Authorization": f"Bearer {KEY_ADMIN}"}
    app = create_app(PlacementFrontend(instances), tenants=registry, adapters_root=root)
    with serving(app) as url:
        assert httpx.post(
            url + "/v1/adapters", json={"name": "support-x", "path": "support-v2"}, headers=admin
        ).is_success
        assert all("support-x" in b.adapters for b in instances.values())
        a = oai(url, KEY_A)
        assert "support-x" in [m.id for m in a.models.list()]
        assert a.completions.create(model="support-x", prompt="zz", max_tokens=3).choices[0].text == "zzz"
        assert httpx.delete(url + "/v1/adapters/support-x", headers=admin).status_code == 200
        assert not any("support-x" in b.adapters for b in instances.values())
        with pytest.raises(openai.NotFoundError):
            a.completions.create(model="support-x", prompt="x", max_tokens=2)


def _write_peft(folder: Path, config, rank: int, seed: int) -> None:
    """A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) with random A and B on q and v."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    dims = config.projection_shapes()
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for proj in ("q_proj", "v_proj"):
            h_in, h_out = dims[proj]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, h_in, generator=gen)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(h_out, rank, generator=gen)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    meta = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(meta))


def test_runtime_adapter_on_the_cpu_engine(registry, tmp_path):
    pytest.importorskip("torch")
    from gpufleet.serve.async_backend import AsyncEngine
    from gpufleet.serve.cluster import WorkerOptions, build_engine

    root = tmp_path / "adapters"
    engine = build_engine(WorkerOptions(base="tiny-llama-random", adapters=None, max_rank=8))
    _write_peft(root / "tuned", engine.model.config, rank=8, seed=1)
    _write_peft(root / "too-big", engine.model.config, rank=16, seed=2)
    backend = AsyncEngine(engine)
    admin = {"Authorization": f"Bearer {KEY_ADMIN}"}
    try:
        with serving(create_app(backend, tenants=registry, adapters_root=root, max_running=8)) as url:
            ops = oai(url, KEY_ADMIN)
            base = ops.completions.create(model="tiny-llama-random", prompt="hello", max_tokens=8, temperature=0)
            r = httpx.post(url + "/v1/adapters", json={"name": "tuned", "path": "tuned"}, headers=admin)
            assert r.status_code == 201, r.text
            tuned = ops.completions.create(model="tuned", prompt="hello", max_tokens=8, temperature=0)
            assert tuned.usage.completion_tokens == 8 and tuned.choices[0].text != base.choices[0].text
            assert engine.state()["adapter_loads"] == 1
            r = httpx.post(url + "/v1/adapters", json={"name": "big", "path": "too-big"}, headers=admin)
            assert r.status_code == 400 and "--max-rank 16" in r.json()["error"]["message"]
            assert httpx.delete(url + "/v1/adapters/tuned", headers=admin).status_code == 200
            assert "tuned" not in engine.store and engine.adapters.resident() == []
            with pytest.raises(openai.NotFoundError):
                ops.completions.create(model="tuned", prompt="hello", max_tokens=2)
    finally:
        backend.close()


def test_async_engine_refuses_before_the_first_chunk_and_aborts_a_closed_stream():
    """Requests reach the engine through its inbox: a refusal still raises before any chunk, a stream closed
    early still aborts the request in the engine."""
    pytest.importorskip("torch")
    import asyncio
    from contextlib import aclosing

    from gpufleet.serve.async_backend import AsyncEngine
    from gpufleet.serve.cluster import WorkerOptions, build_engine
    from gpufleet.serve.protocol import SamplingParams, UnknownAdapterError

    backend = AsyncEngine(build_engine(WorkerOptions(base="tiny-llama-random", random_adapters=1, rank=4)))

    async def scenario() -> None:
        with pytest.raises(UnknownAdapterError):
            await anext(backend.generate("hi", "nope", SamplingParams(max_tokens=4), "r0"))
        async with aclosing(
            backend.generate("hi", "lora-0", SamplingParams(max_tokens=500, ignore_eos=True), "r1")
        ) as s:
            assert (await anext(s)).request_id == "r1"
        for _ in range(200):
            if not backend.engine.requests:
                break
            await asyncio.sleep(0.01)
        assert backend.engine.requests == {} and backend._streams == {}
        chunks = [
            c async for c in backend.generate([1, 2, 3], None, SamplingParams(max_tokens=3, ignore_eos=True), "r2")
        ]
        assert [c.completion_tokens for c in chunks] == [1, 2, 3] and chunks[-1].finish_reason == "length"

    try:
        asyncio.run(scenario())
    finally:
        backend.close()
