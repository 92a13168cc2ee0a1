"""The table of a multi-LoRA serving benchmark (:func:`gpufleet.serve.bench.run_serve_bench`'s results), shared
by ``gpufleet serve bench`` and ``bench/serve_bench.py``; needs no torch."""

from __future__ import annotations

from typing import Any

__all__ = ["serve_bench_table"]


def serve_bench_table(results: list[dict[str, Any]]) -> Any:
    """A Rich table with one row per popularity x system, with the ratios the bar is stated in."""
    from rich.table import Table

    table = Table(title="multi-LoRA serving throughput (tokens/s = prompt + generated, as Punica counts)")
    for col in (
        "popularity",
        "adapters",
        "system",
        "tokens/s",
        "p50 ms/token",
        "p99 ms/token",
        "p50 first token s",
        "× per-adapter",
        "base-only ÷ this",
    ):
        table.add_column(col, justify="left" if col in ("popularity", "system") else "right")
    for r in results:
        s = r["systems"]
        for name, row in s.items():
            vs_per = row["tokens_per_s"] / s["per_adapter"]["tokens_per_s"] if "per_adapter" in s else float("nan")
            vs_base = s["base_only"]["tokens_per_s"] / row["tokens_per_s"] if "base_only" in s else float("nan")
            table.add_row(
                r["popularity"],
                str(r["adapters"]),
                name,
                f"{row['tokens_per_s']:.1f}",
                f"{row['p50_token_latency_ms']:.1f}",
                f"{row['p99_token_latency_ms']:.1f}",
                f"{row['p50_first_token_s']:.2f}",
                f"{vs_per:.2f}×",
                f"{vs_base:.2f}×",
            )
    return table
