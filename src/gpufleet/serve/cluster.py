"""Several engine processes behind Punica's placement front end: ``gpufleet serve --instances N``.

``launch_cluster`` starts ``instances`` worker processes (``python -m gpufleet.serve.cluster worker ...``), each
an Engine + AsyncEngine + the OpenAI app under uvicorn on ``port + 1 + i`` (bound to 127.0.0.1: workers are
internal), waits until every worker answers ``/health``, then serves on ``port`` the same OpenAI app over a
``PlacementFrontend`` of one ``RemoteBackend`` per worker. That is Punica's shape (one scheduler, one runner per
GPU) without any RPC layer of our own: the workers speak the public HTTP API.

Lifecycle:

* Ctrl-C or SIGTERM stops the front end (uvicorn's graceful shutdown, at most ``GRACEFUL_S``), then every worker
  (SIGTERM, then SIGKILL after ``GRACEFUL_S``). Workers also watch their parent and exit if it disappears, so a
  front end killed with SIGKILL leaves nothing behind.
* A worker that exits while serving is reported on the log and taken out of placement (no capacity, no
  adapters); the others go on. When none is left, the front end stops.
* With ``device="cuda"`` worker ``i`` sees one GPU: the ``i``-th of ``CUDA_VISIBLE_DEVICES`` (or of 0..N-1),
  round robin when there are fewer GPUs than workers.

Workers report their engine's ``state()`` plus ``served`` (requests started there) on ``GET /v1/state``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpufleet.errors import ServeError
from gpufleet.serve.protocol import GenerationChunk, SamplingParams

log = logging.getLogger("gpufleet.serve.cluster")

GRACEFUL_S = 5.0
HEALTH_POLL_S = 0.2
WATCH_POLL_S = 0.5
WORKER_HOST = "127.0.0.1"


# -------------------------------------------------------------------------------------------- worker options
@dataclass(frozen=True)
class WorkerOptions:
    """What every worker builds: the base model, its adapters and the engine's limits (one GPU or CPU each).

    ``random_adapters`` > 0 registers that many random rank-``rank`` adapters (``lora-0`` ...), the same on every
    worker (seeded), for demos and tests without adapters on disk.
    """

    base: str
    adapters: str | None = None
    random_adapters: int = 0
    rank: int = 16
    max_rank: int | None = None
    max_batch: int = 32
    kv_blocks: int = 2048
    block_size: int = 16
    adapter_slots: int = 32
    max_waiting: int = 1024
    dtype: str = "float32"
    device: str = "cpu"
    lora_backend: str = "auto"
    threads: int | None = None
    seed: int = 0

    def argv(self) -> list[str]:
        """These options as ``worker`` command-line flags."""
        args: list[str] = []
        for name, value in asdict(self).items():
            if value is not None:
                args += [f"--{name.replace('_', '-')}", str(value)]
        return args

    def check(self) -> None:
        """Refuse impossible values before any process starts."""
        for name in ("max_batch", "kv_blocks", "block_size", "adapter_slots", "max_waiting", "rank"):
            if getattr(self, name) < 1:
                raise ServeError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.max_rank is not None and self.max_rank < 1:
            raise ServeError(f"--max-rank must be at least 1 (got {self.max_rank})")
        if self.random_adapters < 0:
            raise ServeError(f"--random-adapters must be 0 or more (got {self.random_adapters})")
        if self.adapters is not None and not Path(self.adapters).is_dir():
            raise ServeError(f"--adapters {self.adapters}: no such folder (one PEFT adapter folder per name)")


def _add_option_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``WorkerOptions`` field (``--max-batch`` ...)."""
    defaults = WorkerOptions(base="")
    for name, value in asdict(defaults).items():
        if name == "base":
            parser.add_argument("--base", required=True, help="model folder or random shape (tiny-llama-random)")
            continue
        kind = int if isinstance(value, int) or name in ("threads", "max_rank") else str
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value)


def _options_from(args: argparse.Namespace) -> WorkerOptions:
    return WorkerOptions(**{name: getattr(args, name) for name in WorkerOptions.__dataclass_fields__})


# ---------------------------------------------------------------------------------------------- the worker
class CountingBackend:
    """An engine backend that also counts the requests it started (``served`` in ``state()``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.served = 0

    def base_model_name(self) -> str:
        return self.inner.base_model_name()

    def adapter_names(self) -> list[str]:
        return self.inner.adapter_names()

    def state(self) -> dict[str, Any]:
        """The engine's state plus ``served``."""
        return {**self.inner.state(), "served": self.served}

    def count_tokens(self, prompt: str) -> int:
        return self.inner.count_tokens(prompt)

    async def load_adapter(self, name: str, folder: Path) -> None:
        await self.inner.load_adapter(name, folder)

    async def unload_adapter(self, name: str) -> None:
        await self.inner.unload_adapter(name)

    async def generate(
        self, prompt: str | list[int], adapter: str | None, params: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        """The engine's stream; closing this one closes the engine's (which aborts the request)."""
        self.served += 1
        async with aclosing(self.inner.generate(prompt, adapter, params, request_id)) as chunks:
            async for chunk in chunks:
                yield chunk


def build_engine(options: WorkerOptions) -> Any:
    """The worker's Engine: model, tokenizer, adapters from disk and/or random ones."""
    import torch

    from gpufleet.serve.adapters import AdapterStore
    from gpufleet.serve.bench import random_adapters
    from gpufleet.serve.continuous_batching import Engine, EngineConfig
    from gpufleet.serve.tokenizer import load_tokenizer
    from gpufleet.serve.weights import load_model

    if options.threads:
        torch.set_num_threads(options.threads)
    dtype = _torch_dtype(options.dtype)
    model = load_model(options.base, dtype=dtype, device=options.device, seed=options.seed)
    store = AdapterStore(model.config, options.adapters)
    names = [f"lora-{i}" for i in range(options.random_adapters)]
    for adapter in random_adapters(model.config, names, options.rank, seed=options.seed):
        store.add(adapter)
    config = EngineConfig(
        max_batch=options.max_batch,
        block_size=options.block_size,
        kv_blocks=options.kv_blocks,
        adapter_slots=options.adapter_slots,
        max_rank=options.max_rank,
        max_waiting=options.max_waiting,
        lora_backend=options.lora_backend,
    )
    tokenizer = load_tokenizer(options.base, model.config.bos_token_id, model.config.eos_ids)
    return Engine(model, store, config, tokenizer, name=Path(options.base).name)


def _torch_dtype(name: str) -> Any:
    import torch

    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float16": torch.float16,
        "fp16": torch.float16,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    if name not in table:
        raise ServeError(f"--dtype {name!r}: choose float32, float16 or bfloat16")
    return table[name]


def _watch_parent(parent_pid: int) -> None:
    """Exit (gracefully, then hard) once the front end that started this worker is gone."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACEFUL_S)
        os._exit(1)

    if parent_pid > 0:
        threading.Thread(target=watch, name="gpufleet-parent-watch", daemon=True).start()


def run_worker(
    options: WorkerOptions, port: int, host: str = WORKER_HOST, *, parent_pid: int = 0, log_level: str = "warning"
) -> None:
    """Serve one engine over HTTP until SIGTERM/SIGINT (or until ``parent_pid`` exits)."""
    import uvicorn

    from gpufleet.serve.async_backend import AsyncEngine
    from gpufleet.serve.server import create_app

    _watch_parent(parent_pid)
    engine = build_engine(options)
    backend = AsyncEngine(engine)
    try:
        app = create_app(CountingBackend(backend), model_name=engine.name, adapters_root=options.adapters)
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        backend.close()


# --------------------------------------------------------------------------------------------- the cluster
@dataclass
class Worker:
    """One worker process and where it listens."""

    index: int
    port: int
    process: subprocess.Popen[bytes]
    reported: bool = False

    @property
    def name(self) -> str:
        return f"worker-{self.index}"

    @property
    def url(self) -> str:
        return f"http://{WORKER_HOST}:{self.port}"


@dataclass
class Cluster:
    """Worker processes and the front end's backends over them; ``start``/``stop`` or use it as a context manager.

    ``port`` is the front end's; worker ``i`` listens on ``port + 1 + i``.
    """

    options: WorkerOptions
    instances: int = 2
    port: int = 8000
    worker_log_level: str = "warning"
    startup_timeout_s: float = 600.0
    python: str = sys.executable
    workers: list[Worker] = field(default_factory=list)
    backends: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise ServeError(f"--instances must be at least 1 (got {self.instances})")
        self.options.check()

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------- start
    def start(self) -> None:
        """Spawn every worker, wait until each answers /health, then connect a RemoteBackend to each."""
        from gpufleet.serve.remote import RemoteBackend

        try:
            for i in range(self.instances):
                self.workers.append(self._spawn(i))
            deadline = time.monotonic() + self.startup_timeout_s
            for worker in self.workers:
                self._wait_healthy(worker, deadline)
            counter = token_counter(self.options.base)
            for worker in self.workers:
                backend = RemoteBackend(worker.url, count_tokens=counter)
                backend.refresh()
                self.backends[worker.name] = backend
        except BaseException:
            self.stop()
            raise

    def _spawn(self, index: int) -> Worker:
        port = self.port + 1 + index
        cmd = [
            self.python,
            "-m",
            "gpufleet.serve.cluster",
            "worker",
            "--port",
            str(port),
            "--parent-pid",
            str(os.getpid()),
            "--log-level",
            self.worker_log_level,
            *self.options.argv(),
        ]
        process = subprocess.Popen(cmd, env=self._env(index))
        log.info("started worker-%d (pid %d) on port %d", index, process.pid, port)
        return Worker(index, port, process)

    def _env(self, index: int) -> dict[str, str]:
        """The worker's environment: one GPU of the visible ones when serving on CUDA."""
        env = dict(os.environ)
        if self.options.device == "cuda":
            visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            visible = visible or [str(k) for k in range(self.instances)]
            env["CUDA_VISIBLE_DEVICES"] = visible[index % len(visible)]
        return env

    def _wait_healthy(self, worker: Worker, deadline: float) -> None:
        """Poll /health until it answers 200; a worker that exits or a timeout raises ServeError."""
        while True:
            code = worker.process.poll()
            if code is not None:
                raise ServeError(
                    f"{worker.name} (port {worker.port}) exited with code {code} while starting; "
                    f"its error is printed above (a busy port? a bad --base?)"
                )
            try:
                if httpx.get(f"{worker.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ServeError(
                    f"{worker.name} did not answer {worker.url}/health within "
                    f"{self.startup_timeout_s:g} s; raise the startup timeout for large models"
                )
            time.sleep(HEALTH_POLL_S)

    # ------------------------------------------------------------------------------------------- serving
    def frontend(self) -> Any:
        """The ``PlacementFrontend`` over the workers (call after ``start``)."""
        from gpufleet.serve.placement import PlacementFrontend

        if not self.backends:
            raise ServeError("the cluster has no running workers; call start() first")
        return PlacementFrontend(self.backends, max_batch=self.options.max_batch)

    def check_workers(self) -> list[Worker]:
        """Workers that exited since the last check: logged once and taken out of placement."""
        dead = []
        for worker in self.workers:
            code = worker.process.poll()
            if code is None or worker.reported:
                continue
            worker.reported = True
            dead.append(worker)
            log.error(
                "%s (pid %d, port %d) exited with code %s; its requests fail, the other workers go on",
                worker.name,
                worker.process.pid,
                worker.port,
                code,
            )
            backend = self.backends.get(worker.name)
            if backend is not None:
                backend.mark_down(f"process exited with code {code}")
        return dead

    def alive(self) -> int:
        """Workers still running."""
        return sum(1 for w in self.workers if w.process.poll() is None)

    # ---------------------------------------------------------------------------------------------- stop
    def stop(self) -> None:
        """SIGTERM every worker, SIGKILL what is left after ``GRACEFUL_S``; waits for all of them."""
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.terminate()
        deadline = time.monotonic() + GRACEFUL_S
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


def token_counter(base: str) -> Callable[[str], int] | None:
    """Token counts of text prompts with the workers' tokenizer, loaded here without torch (None if it cannot be)."""
    from gpufleet.serve.config import NAMED_RANDOM_MODELS, LlamaConfig
    from gpufleet.serve.tokenizer import load_tokenizer

    try:
        config = NAMED_RANDOM_MODELS.get(base) or LlamaConfig.load(base)
        tokenizer = load_tokenizer(base, config.bos_token_id, config.eos_ids)
    except ServeError:
        return None
    return lambda text: len(tokenizer.encode(text))


def _watch(cluster: Cluster, server: Any, stop: threading.Event) -> None:
    """Report workers that die; stop the front end when none is left."""
    while not stop.wait(WATCH_POLL_S):
        cluster.check_workers()
        if cluster.alive() == 0:
            log.error("every worker has exited; stopping the front end")
            server.should_exit = True
            return


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def launch_cluster(
    base: str,
    adapters: str | Path | None = None,
    instances: int = 2,
    port: int = 8000,
    host: str = "127.0.0.1",
    *,
    max_batch: int = 32,
    kv_blocks: int = 2048,
    block_size: int = 16,
    adapter_slots: int = 32,
    max_waiting: int = 1024,
    dtype: str = "float32",
    device: str = "cpu",
    lora_backend: str = "auto",
    random_adapters: int = 0,
    rank: int = 16,
    max_rank: int | None = None,
    threads: int | None = None,
    max_concurrent: int | None = None,
    log_level: str = "info",
    startup_timeout_s: float = 600.0,
    tenants: Any = None,
) -> None:
    """Start ``instances`` engine workers and serve them behind Punica's placement on ``host:port`` until
    Ctrl-C / SIGTERM; then stop every worker. See the module docstring for ports, devices and failures.
    ``tenants`` (a ``TenantRegistry``) turns on API keys on the front end; the workers stay on 127.0.0.1."""
    import uvicorn

    from gpufleet.serve.server import create_app

    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request to a worker
    if threads is None and device == "cpu":
        threads = max(1, (os.cpu_count() or 1) // instances)
    options = WorkerOptions(
        base=base,
        adapters=None if adapters is None else str(adapters),
        random_adapters=random_adapters,
        rank=rank,
        max_rank=max_rank,
        max_batch=max_batch,
        kv_blocks=kv_blocks,
        block_size=block_size,
        adapter_slots=adapter_slots,
        max_waiting=max_waiting,
        dtype=dtype,
        device=device,
        lora_backend=lora_backend,
        threads=threads,
    )
    cluster = Cluster(options, instances=instances, port=port, startup_timeout_s=startup_timeout_s)
    # SIGTERM raises KeyboardInterrupt while workers start, and again when uvicorn re-raises the signal it caught
    # after its graceful shutdown: either way the ``finally`` below stops the workers.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    stop = threading.Event()
    try:
        cluster.start()
        frontend = cluster.frontend()
        app = create_app(
            frontend,
            max_concurrent=max_concurrent,
            tenants=tenants,
            adapters_root=adapters,
            max_running=max_batch * instances,
            max_waiting=max_waiting,
        )
        server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=int(GRACEFUL_S))
        )
        threading.Thread(target=_watch, args=(cluster, server, stop), name="gpufleet-worker-watch", daemon=True).start()
        log.info(
            "serving %s on http://%s:%d/v1 over %d workers (ports %d-%d)",
            frontend.base_model_name(),
            host,
            port,
            instances,
            port + 1,
            port + instances,
        )
        server.run()
        if cluster.alive() == 0:
            raise ServeError("every worker exited (their errors are above); the front end stopped")
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        signal.signal(signal.SIGTERM, previous)
        cluster.stop()
        log.info("stopped %d workers", len(cluster.workers))


# ----------------------------------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpufleet.serve.cluster",
        description="gpufleet serving cluster: a placement front end over engine "
        "workers (serve), or one worker (worker).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="one engine behind the OpenAI API (started by `serve`)")
    worker.add_argument("--port", type=int, required=True)
    worker.add_argument("--host", default=WORKER_HOST)
    worker.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    worker.add_argument("--log-level", default="warning")
    _add_option_flags(worker)
    serve = sub.add_parser("serve", help="workers + the placement front end")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--instances", type=int, default=2)
    serve.add_argument("--log-level", default="info")
    _add_option_flags(serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``worker`` or ``serve``; a ServeError prints one line and exits 2."""
    args = _parser().parse_args(argv)
    options = _options_from(args)
    try:
        if args.command == "worker":
            run_worker(options, args.port, args.host, parent_pid=args.parent_pid, log_level=args.log_level)
        else:
            fields = {k: v for k, v in asdict(options).items() if k != "seed"}
            launch_cluster(**fields, instances=args.instances, port=args.port, host=args.host, log_level=args.log_level)
    except ServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
