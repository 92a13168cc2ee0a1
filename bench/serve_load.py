"""Load: 500 concurrent streams from five tenants through the official ``openai`` client, twice.

    python bench/serve_load.py                     # about a minute on 2 CPU cores
    python bench/serve_load.py --streams 1000

The server (CPU engine, random tiny Llama, 8 random adapters, batch 32, fair queue of 1024) runs in a child
process whose resident memory (RSS) is sampled: when it has started, after a warm-up of 20 requests (the
reference: first forwards allocate), at its peak under load, and 3 s after each round. Tenant ``e`` has a limit of
20 requests/s, so part of its streams get 429; no other error is expected. At the end ``/metrics`` is parsed with
prometheus_client and its generation-token counter compared with the sum of the usage the clients received.

The bar: no error but 429, the server still up, and its RSS after the load within 10 % of the reference.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from serve_child import start_server

TENANTS = ("a", "b", "c", "d", "e")
ADMIN_KEY = "sk-bench-ops-0000000000"
console = Console(width=160)


def key(tenant: str) -> str:
    return f"sk-bench-{tenant}-0000000000"


def keys_file(folder: Path) -> Path:
    path = folder / "keys.toml"
    tables = [f'[[tenant]]\nname = "{t}"\nkey = "{key(t)}"\nadapters = ["*"]\n' for t in TENANTS]
    tables[-1] += "requests_per_s = 20\n"
    tables.append(f'[[tenant]]\nname = "ops"\nkey = "{ADMIN_KEY}"\nadapters = ["*"]\nadmin = true\n')
    path.write_text("\n".join(tables))
    return path


def rss_mb(process: psutil.Process) -> float:
    return process.memory_info().rss / 2**20


async def round_of(url: str, streams: int, max_tokens: int) -> dict[str, object]:
    """``streams`` concurrent streamed requests, tenants in turn; outcome counts, tokens received, TTFTs."""
    clients = {t: openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key(t), max_retries=0, timeout=600) for t in TENANTS}
    outcomes: dict[str, int] = {}
    tokens, ttft = [0], []

    async def one(i: int) -> None:
        tenant = TENANTS[i % len(TENANTS)]
        sent = time.perf_counter()
        try:
            if i % 2:
                stream = await clients[tenant].completions.create(
                    model=f"lora-{i % 8}",
                    prompt=f"request {i} " * 3,
                    max_tokens=max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            else:
                stream = await clients[tenant].chat.completions.create(
                    model=f"lora-{i % 8}",
                    messages=[{"role": "user", "content": f"request {i}"}],
                    max_tokens=max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            first = None
            async for chunk in stream:
                first = first or time.perf_counter() - sent
                if chunk.usage is not None:
                    tokens[0] += chunk.usage.completion_tokens
            ttft.append(first)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except openai.APIStatusError as exc:
            outcomes[str(exc.status_code)] = outcomes.get(str(exc.status_code), 0) + 1
        except openai.APIError as exc:
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(streams)))
    wall = time.perf_counter() - start
    for client in clients.values():
        await client.close()
    return {"outcomes": outcomes, "tokens": tokens[0], "ttft": ttft, "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()

    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, start_server(keys_file(Path(tmp)), max_running=32) as (url, child):
        server = psutil.Process(child.pid)
        cold = rss_mb(server)
        warm = asyncio.run(round_of(url, 20, args.max_tokens))
        received = warm["tokens"]
        reference = rss_mb(server)
        for r in range(args.rounds):
            peak, stop = [reference], threading.Event()

            def sample(peak: list[float] = peak, stop: threading.Event = stop) -> None:
                while not stop.wait(0.1):
                    peak[0] = max(peak[0], rss_mb(server))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            result = asyncio.run(round_of(url, args.streams, args.max_tokens))
            stop.set()
            sampler.join()
            time.sleep(3.0)
            after = rss_mb(server)
            received += result["tokens"]
            rows.append((r + 1, result, peak[0], after))
        alive = child.poll() is None and httpx.get(url + "/health").status_code == 200
        text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
        counted = sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "gpufleet_generation_tokens_total"
        )

    table = Table(
        title=f"{args.streams} concurrent streams x {args.rounds} rounds, max_tokens {args.max_tokens}, 5 tenants "
        f"(e limited to 20 req/s); server RSS: {cold:.0f} MB started, {reference:.0f} MB after warm-up "
        f"(reference); {time.perf_counter() - t0:.0f} s in all",
        header_style="bold",
    )
    columns = ("round", "ok", "429", "other errors", "wall s", "tokens", "p50 TTFT s", "p99 TTFT s", "RSS peak MB")
    for col in (*columns, "RSS after MB", "after ÷ reference"):
        table.add_column(col, justify="right")
    worst = 0.0
    for number, result, peak, after in rows:
        outcomes = dict(result["outcomes"])
        ok, limited = outcomes.pop("ok", 0), outcomes.pop("429", 0)
        ttft = sorted(result["ttft"])
        worst = max(worst, abs(after / reference - 1))
        table.add_row(
            str(number),
            str(ok),
            str(limited),
            str(outcomes or 0),
            f"{result['wall']:.1f}",
            str(result["tokens"]),
            f"{statistics.median(ttft):.2f}",
            f"{ttft[int(0.99 * (len(ttft) - 1))]:.2f}",
            f"{peak:.0f}",
            f"{after:.0f}",
            f"{after / reference:.3f}",
        )
    console.print(table)
    console.print(f"/metrics gpufleet_generation_tokens_total = {counted:.0f}; the clients received {received}")
    other = sum(sum(v for k, v in r[1]["outcomes"].items() if k not in ("ok", "429")) for r in rows)
    met = alive and other == 0 and worst <= 0.10 and counted == received
    verdict = "met" if met else "NOT met"
    console.print(
        f"bar (no error but 429, server up, RSS within 10 % of the reference, token counter exact): {verdict} "
        f"(server up: {alive}, other errors: {other}, worst RSS change {100 * worst:.1f} %)"
    )


if __name__ == "__main__":
    main()
