"""The inference load a simulated cluster's inference pools carry: a named load shape from :mod:`gpufleet.traces`,
or LoRA traffic turned into servers needed by :mod:`gpufleet.serve`'s capacity model (``punica`` sources)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpufleet.errors import ConfigError

if TYPE_CHECKING:
    import polars as pl

    from gpufleet.spec import ClusterSpec

__all__ = ["PUNICA_SOURCES", "inference_for", "punica_load"]

#: Sources served by the LoRA capacity model: batched across adapters, or one adapter at a time.
PUNICA_SOURCES = ("punica", "punica-per-adapter")
#: Days of load built past the trace's last submission, so that the drain after it still sees a load.
TAIL_DAYS = 60


def inference_for(spec: ClusterSpec, source: str | None, jobs: pl.DataFrame) -> Any:
    """The inference load of ``source`` for ``spec``'s inference pools over the trace's span; None without such a
    pool. ``source`` is a load name or CSV (default ``genai``), or ``punica[:SHAPE]`` /
    ``punica-per-adapter[:SHAPE]``."""
    pool_servers = sum(p.nodes for p in spec.inference_pools)
    if not pool_servers:
        if source not in (None, "none"):
            raise ConfigError(f"--inference {source}: cluster '{spec.name}' has no inference pool")
        return None
    from gpufleet.traces import load_inference

    span = float(jobs["submit_s"].max()) + TAIL_DAYS * 86400.0 if jobs.height else 86400.0
    kind, _, profile = (source or "").partition(":")
    if kind in PUNICA_SOURCES:
        return punica_load(spec, kind, profile or "genai", pool_servers, span)
    return load_inference(source or "genai", pool_servers=pool_servers, until_s=span)


def punica_load(spec: ClusterSpec, kind: str, profile: str, pool_servers: int, span: float) -> Any:
    """Servers needed to serve LoRA traffic of ``profile``'s shape on the inference pool, batched across adapters
    (``punica``) or one adapter at a time (``punica-per-adapter``); both see the same request rate (the rate at
    which per-adapter serving fills the pool at its peak), so their difference is what batching frees for loaning."""
    from gpufleet.serve.capacity import LoRAServingModel, lora_inference_load

    pool = spec.inference_pools[0]
    serving = LoRAServingModel(gpu=pool.gpu, model="llama3.2-3b")
    system = "gpufleet" if kind == "punica" else "per_adapter"
    return lora_inference_load(
        profile,
        pool_servers=pool_servers,
        until_s=span,
        serving=serving,
        system=system,
        gpus_per_server=pool.gpus_per_node,
    )
