"""Fairness between tenants: tenant A floods at 10x its rate limit while tenant B sends at a steady pace.

    python bench/serve_fairness.py                 # about 2 minutes on 2 CPU cores
    python bench/serve_fairness.py --repeat 3      # every phase 3 times in turns, B's TTFTs pooled

The server (CPU engine, random tiny Llama, 8 random adapters, batch 32) runs in a child process; tenant A's flood
runs in another (non-streamed requests over raw HTTP, so that its client's CPU does not delay B's); tenant B's
streamed requests go through the official ``openai`` client here, which measures B's time to first token. Five
phases, each on a fresh server, with the same B traffic:

* ``B alone``: the unloaded reference;
* ``A at its limit``: A sends exactly its limit (no excess): what A's admitted load alone costs B;
* ``A floods, gpufleet``: A's ``requests_per_s`` limit and the fair queue (``max_running`` = the batch);
* ``A floods, queue only``: the fair queue, no rate limit on A;
* ``A floods, no fairness``: no limits, no fair queue (every request straight into the engine's FCFS queue), as
  before per-tenant fairness existed.

The bar: in ``A floods, gpufleet`` A gets 429s, B gets none, and B's median TTFT is within 1.5x of ``B alone``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
from rich.console import Console
from rich.table import Table

from serve_child import start_server

KEY_A, KEY_B = "sk-bench-tenant-a-000000", "sk-bench-tenant-b-000000"
console = Console(width=200)


def keys_file(folder: Path, a_limit: float | None) -> Path:
    """Tenants a (limited to ``a_limit`` requests/s, or not) and b (no limit)."""
    limit = "" if a_limit is None else f"requests_per_s = {a_limit}\n"
    path = folder / f"keys-{a_limit}.toml"
    path.write_text(
        f'[[tenant]]\nname = "a"\nkey = "{KEY_A}"\nadapters = ["*"]\n{limit}\n'
        f'[[tenant]]\nname = "b"\nkey = "{KEY_B}"\nadapters = ["*"]\n'
    )
    return path


# ------------------------------------------------------------------------------------------------ the flood
async def flood(url: str, rate: float, seconds: float, max_tokens: int, seed: int) -> dict[str, int]:
    """Poisson arrivals at ``rate``/s for ``seconds``, non-streamed; counts of each HTTP status."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one(i: int) -> None:
            body = {"model": f"lora-{i % 8}", "prompt": f"A{i} flood " * 4, "max_tokens": max_tokens}
            try:
                r = await client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY_A}"})
                key = str(r.status_code)
            except httpx.HTTPError as exc:
                key = type(exc).__name__
            counts[key] = counts.get(key, 0) + 1

        tasks, start, i = [], time.monotonic(), 0
        while time.monotonic() - start < seconds:
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return counts


# ----------------------------------------------------------------------------------------------- tenant B
async def steady(url: str, rate: float, seconds: float, max_tokens: int, seed: int) -> dict[str, object]:
    """B: one streamed request every 1/``rate`` s with the openai client; TTFT of each and the errors."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY_B, max_retries=0, timeout=300)
    rng = random.Random(seed)
    ttft: list[float] = []
    errors: dict[str, int] = {}

    async def one(i: int) -> None:
        sent = time.perf_counter()
        try:
            stream = await client.completions.create(
                model=f"lora-{rng.randrange(8)}", prompt=f"B{i} steady " * 4, max_tokens=max_tokens, stream=True
            )
            first = None
            async for _ in stream:
                if first is None:
                    first = time.perf_counter() - sent
            ttft.append(first if first is not None else float("nan"))
        except openai.APIStatusError as exc:
            errors[str(exc.status_code)] = errors.get(str(exc.status_code), 0) + 1

    tasks, start, i = [], time.monotonic(), 0
    while time.monotonic() - start < seconds:
        tasks.append(asyncio.create_task(one(i)))
        i += 1
        await asyncio.sleep(1.0 / rate)
    await asyncio.gather(*tasks)
    await client.close()
    return {"ttft": ttft, "errors": errors}


def run_phase(
    keys: Path, max_running: int | None, args: argparse.Namespace, with_flood: bool, a_times: float = 10.0
) -> dict[str, object]:
    """One phase on a fresh server: a warm-up, then B's steady traffic, with A sending ``a_times`` its limit."""
    with start_server(keys, max_running=max_running) as (url, _):
        asyncio.run(steady(url, 10.0, 1.0, args.b_tokens, seed=0))  # warm-up, not measured: first forwards are slow
        flooder = None
        if with_flood:
            cmd = [sys.executable, __file__, "--flood-url", url, "--seconds", str(args.seconds)]
            cmd += ["--a-limit", str(args.a_limit), "--a-tokens", str(args.a_tokens), "--a-times", str(a_times)]
            flooder = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            time.sleep(args.seconds * 0.1)  # let the flood build up before B starts measuring
        b = asyncio.run(steady(url, args.b_rate, args.seconds * 0.8, args.b_tokens, seed=1))
        a_counts: dict[str, int] = {}
        if flooder is not None:
            out, _ = flooder.communicate(timeout=600)
            a_counts = json.loads(out.strip().splitlines()[-1])
        metrics = httpx.get(url + "/health").json()
    return {"b": b, "a": a_counts, "health": metrics}


def _pooled(results: list[dict[str, object]]) -> dict[str, object]:
    """Several runs of a phase as one: B's TTFTs pooled, every count summed."""
    a: dict[str, int] = {}
    errors: dict[str, int] = {}
    for result in results:
        for k, v in result["a"].items():
            a[k] = a.get(k, 0) + v
        for k, v in result["b"]["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {"a": a, "b": {"ttft": [t for r in results for t in r["b"]["ttft"]], "errors": errors}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--a-limit", type=float, default=5.0, help="tenant A's requests_per_s; it floods at 10x")
    ap.add_argument("--a-tokens", type=int, default=64)
    ap.add_argument("--b-rate", type=float, default=4.0, help="tenant B's requests per second")
    ap.add_argument("--b-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32, help="the fair queue's bound (the engine's batch)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of every phase, in turns; B's TTFTs are pooled")
    ap.add_argument("--flood-url", help=argparse.SUPPRESS)
    ap.add_argument("--a-times", type=float, default=10.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flood_url:  # the flooding child: print A's status counts as one JSON line
        counts = asyncio.run(flood(args.flood_url, args.a_times * args.a_limit, args.seconds, args.a_tokens, seed=7))
        print(json.dumps(counts))
        return

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        limited, unlimited = keys_file(Path(tmp), args.a_limit), keys_file(Path(tmp), None)
        plan = {
            "B alone": (limited, args.batch, False, 10.0),
            "A at its limit": (limited, args.batch, True, 1.0),
            "A floods, gpufleet": (limited, args.batch, True, 10.0),
            "A floods, queue only": (unlimited, args.batch, True, 10.0),
            "A floods, no fairness": (unlimited, None, True, 10.0),
        }
        runs: dict[str, list[dict[str, object]]] = {name: [] for name in plan}
        for _ in range(args.repeat):  # phases in turns, so that a slow spell of the machine hits each alike
            for name, (keys, max_running, with_flood, times) in plan.items():
                runs[name].append(run_phase(keys, max_running, args, with_flood, times))
    phases = {name: _pooled(results) for name, results in runs.items()}
    alone_runs = [statistics.median(r["b"]["ttft"]) for r in runs["B alone"]]
    ratios = {
        name: [statistics.median(r["b"]["ttft"]) / ref for r, ref in zip(rs, alone_runs, strict=True)]
        for name, rs in runs.items()
    }
    table = Table(
        title=f"tenant A floods at {10 * args.a_limit:g} req/s (10x its limit of {args.a_limit:g}) x "
        f"{args.a_tokens} tokens; tenant B sends {args.b_rate:g} req/s x {args.b_tokens} tokens, streamed "
        f"({args.seconds:g} s phases x {args.repeat}, {time.perf_counter() - t0:.0f} s in all)",
        header_style="bold",
    )
    for col in (
        "phase",
        "A ok",
        "A 429",
        "A other",
        "B requests",
        "B errors",
        "B median TTFT ms",
        "B p90 TTFT ms",
        "÷ B alone",
    ):
        table.add_column(col, justify="left" if col == "phase" else "right")
    alone = statistics.median(phases["B alone"]["b"]["ttft"])
    for name, result in phases.items():
        ttft = sorted(result["b"]["ttft"])
        median = statistics.median(ttft)
        a = result["a"]
        other = sum(v for k, v in a.items() if k not in ("200", "429"))
        table.add_row(
            name,
            str(a.get("200", "-")) if a else "-",
            str(a.get("429", 0)) if a else "-",
            str(other) if a else "-",
            str(len(ttft) + sum(result["b"]["errors"].values())),
            json.dumps(result["b"]["errors"]) if result["b"]["errors"] else "0",
            f"{1000 * median:.1f}",
            f"{1000 * ttft[int(0.9 * (len(ttft) - 1))]:.1f}",
            f"{median / alone:.2f}x",
            " ".join(f"{x:.2f}" for x in ratios[name]),
        )
    console.print(table)
    fair = phases["A floods, gpufleet"]
    met = (
        fair["a"].get("429", 0) > 0 and not fair["b"]["errors"] and statistics.median(fair["b"]["ttft"]) <= 1.5 * alone
    )
    console.print(f"bar (A gets 429s, B none, B's median TTFT within 1.5x of B alone): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
