"""A gpufleet server in a child process for the serving benches (``serve_fairness.py``, ``serve_load.py``).

The server runs in its own process so that the clients' CPU time and memory are not the server's: ``start_server``
launches ``python bench/serve_child.py`` (the CPU engine on a random tiny Llama with random adapters, behind the
OpenAI app with the given keys file and queue bound) and waits for ``/health``.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

HERE = Path(__file__).resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def start_server(
    keys: Path, *, max_running: int | None, adapters: int = 8, threads: int = 1, base: str = "tiny-llama-random"
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The child server's URL and process; stopped (SIGTERM, then SIGKILL) on exit."""
    port = free_port()
    cmd = [sys.executable, str(HERE), "--port", str(port), "--keys", str(keys), "--adapters", str(adapters)]
    cmd += ["--threads", str(threads), "--base", base]
    if max_running is not None:
        cmd += ["--max-running", str(max_running)]
    process = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with code {process.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start within 120 s")
            time.sleep(0.2)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--keys", type=Path, required=True)
    ap.add_argument("--max-running", type=int, default=None, help="the fair queue's bound (omit: none, FCFS engine)")
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base", default="tiny-llama-random")
    args = ap.parse_args()

    import uvicorn

    from gpufleet.serve.async_backend import AsyncEngine
    from gpufleet.serve.cluster import WorkerOptions, build_engine
    from gpufleet.serve.server import create_app
    from gpufleet.serve.tenants import load_keys

    options = WorkerOptions(base=args.base, random_adapters=args.adapters, rank=8, threads=args.threads)
    engine = build_engine(options)
    app = create_app(
        AsyncEngine(engine),
        model_name=engine.name,
        tenants=load_keys(args.keys),
        max_running=args.max_running,
        max_waiting=1024,
    )
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
