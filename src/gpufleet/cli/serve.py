"""``gpufleet serve``: thin command-line shells over :mod:`gpufleet.serve` (Punica-style multi-LoRA serving).

``gpufleet serve --base DIR --adapters DIR`` starts the OpenAI-compatible server; ``gpufleet serve bench`` runs
Punica's workload against the per-adapter and base-only baselines. torch, triton, fastapi and uvicorn are the
``gpufleet[serve]`` extra and load inside the commands, so ``gpufleet serve --help`` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.common import err, out
from gpufleet.errors import ServeError

serve_app = typer.Typer(
    help="Serve many LoRA adapters of one base model from one GPU (Punica): requests for different adapters share "
    "every forward pass.\n\n"
    "`gpufleet serve --base ./llama-dir --adapters ./adapters/ --port 8000` starts an OpenAI-compatible server "
    "(`/v1/completions`, `/v1/chat/completions`, `/v1/models`); the model name of a request picks its adapter. "
    "`gpufleet serve bench` compares batched multi-adapter serving with one-adapter-at-a-time serving.",
    rich_markup_mode="markdown",
    invoke_without_command=True,
)

SERVE_HINT = "this command needs the serving extra: pip install 'gpufleet[serve]'"


def _need_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import torch  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ServeError(f"{SERVE_HINT} ({exc.name} is missing)") from exc


@serve_app.callback()
def serve(
    ctx: typer.Context,
    base: Annotated[
        str | None,
        typer.Option(
            help="Hugging Face model folder (config.json + safetensors), or a "
            "random shape: tiny-llama-random, small-llama-random, "
            "wide-llama-random"
        ),
    ] = None,
    adapters: Annotated[
        Path | None,
        typer.Option(help="folder of PEFT adapter folders; each folder's name is the model name clients ask for"),
    ] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    instances: Annotated[int, typer.Option(help="engine processes behind Punica's placement front end")] = 1,
    max_batch: Annotated[int, typer.Option(help="requests per forward pass")] = 32,
    kv_blocks: Annotated[int, typer.Option(help="KV cache blocks of --block-size tokens")] = 2048,
    block_size: Annotated[int, typer.Option()] = 16,
    adapter_slots: Annotated[int, typer.Option(help="adapters resident on the device (LRU beyond)")] = 32,
    max_waiting: Annotated[int, typer.Option(help="queued requests before 429 Too Many Requests")] = 1024,
    dtype: Annotated[str, typer.Option(help="float32 (CPU default), float16 or bfloat16")] = "float32",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    lora_backend: Annotated[str, typer.Option(help="auto (triton on a GPU, else torch), torch or triton")] = "auto",
    api_keys: Annotated[
        Path | None,
        typer.Option(
            help="TOML file of tenants: key (or key_sha256), adapters they may use, rate limits, admin "
            "(docs/serve_multitenant.md). Without it the server only listens on 127.0.0.1."
        ),
    ] = None,
    max_rank: Annotated[
        int | None, typer.Option(help="largest LoRA rank the slots hold (default: the largest at start, at least 8)")
    ] = None,
) -> None:
    """Start the OpenAI-compatible server (when no subcommand is given)."""
    if ctx.invoked_subcommand is not None:
        return
    if base is None:
        out.print(ctx.get_help())
        raise typer.Exit(0)
    from gpufleet.serve.tenants import check_bind, load_keys

    tenants = load_keys(api_keys) if api_keys is not None else None
    access = check_bind(host, tenants)
    _need_serve_extra()
    err.print(access)
    if instances > 1:
        from gpufleet.serve.cluster import launch_cluster

        launch_cluster(
            base=base,
            adapters=adapters,
            instances=instances,
            port=port,
            host=host,
            max_batch=max_batch,
            kv_blocks=kv_blocks,
            block_size=block_size,
            adapter_slots=adapter_slots,
            max_waiting=max_waiting,
            dtype=dtype,
            device=device,
            lora_backend=lora_backend,
            max_rank=max_rank,
            tenants=tenants,
        )
        return
    from gpufleet.serve.async_backend import AsyncEngine
    from gpufleet.serve.cluster import WorkerOptions, build_engine
    from gpufleet.serve.server import run_server

    engine = build_engine(
        WorkerOptions(
            base=base,
            adapters=None if adapters is None else str(adapters),
            max_batch=max_batch,
            kv_blocks=kv_blocks,
            block_size=block_size,
            adapter_slots=adapter_slots,
            max_waiting=max_waiting,
            dtype=dtype,
            device=device,
            lora_backend=lora_backend,
            max_rank=max_rank,
        )
    )
    err.print(f"serving {engine.name} with {len(engine.store.names())} adapter(s) on http://{host}:{port}/v1")
    run_server(
        AsyncEngine(engine),
        host,
        port,
        model_name=engine.name,
        tenants=tenants,
        adapters_root=adapters,
        max_running=max_batch,
        max_waiting=max_waiting,
    )


@serve_app.command("bench")
def bench(
    base: Annotated[str, typer.Option(help="model folder or random shape")] = "small-llama-random",
    popularity: Annotated[str, typer.Option(help="distinct, uniform, skewed, identical, or a comma list")] = "distinct",
    requests: Annotated[
        int,
        typer.Option(
            help="requests, all submitted at once and served with at most 32 in a batch; several batches' worth keep "
            "the batch full, one batch measures mostly its longest request"
        ),
    ] = 512,
    rank: Annotated[int, typer.Option(help="LoRA rank of the random adapters")] = 16,
    systems: Annotated[str, typer.Option(help="gpufleet, per_adapter, base_only")] = "gpufleet,per_adapter,base_only",
    dtype: Annotated[str, typer.Option()] = "float32",
    device: Annotated[str, typer.Option()] = "cpu",
    lora_backend: Annotated[str, typer.Option()] = "auto",
    seed: Annotated[int, typer.Option()] = 0xABCD,
    repeat: Annotated[int, typer.Option(min=1, help="runs per system, in turns; the median run is reported")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (one object per popularity)")] = False,
) -> None:
    """Punica's workload (lognormal lengths, adapter popularity) served by gpufleet, one adapter at a time, and
    the base model alone: throughput (prompt + generated tokens per second) and per-token latency."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ServeError(SERVE_HINT) from exc
    from gpufleet.serve.bench import POPULARITIES, ServeBenchConfig, WorkloadConfig, run_serve_bench

    pops = tuple(p.strip() for p in popularity.split(",") if p.strip())
    unknown = [p for p in pops if p not in POPULARITIES]
    if unknown:
        raise ServeError(f"--popularity {', '.join(unknown)}: choose from {', '.join(POPULARITIES)}")
    config = ServeBenchConfig(
        base=base,
        rank=rank,
        popularities=pops,
        systems=tuple(s.strip() for s in systems.split(",") if s.strip()),
        workload=WorkloadConfig(requests=requests, seed=seed),
        dtype=dtype,
        device=device,
        lora_backend=lora_backend,
        repeat=repeat,
    )
    results = run_serve_bench(config, log=lambda msg: err.print(f"[dim]{msg}[/]"))
    if as_json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1))
        return
    from gpufleet.serve.bench_table import serve_bench_table

    out.print(serve_bench_table(results))
