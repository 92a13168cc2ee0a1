"""Layout search: enumerate TP x PP x DP x CP (x EP for MoE) x micro-batch x virtual stages x recompute, score all
at once.

Every candidate goes through ``step.evaluate`` as one NumPy batch, so a full search for GPT-3 175B on
12,288 GPUs (tens of thousands of layouts) takes well under a second. Layouts that break a divisibility
rule or do not fit in memory are dropped and counted; the rest are ranked by step time, and each loser
is attributed to the component (bubble, TP/PP/DP communication, recomputation) that costs it most
against the winner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from gpufleet.errors import ConfigError
from gpufleet.perf.efficiency import Efficiency, default_efficiency
from gpufleet.perf.flops import RECOMPUTE_MODES, Recompute
from gpufleet.perf.model_spec import ModelSpec
from gpufleet.perf.options import Layout, TrainOptions
from gpufleet.perf.step import BREAKDOWN_KEYS, evaluate
from gpufleet.perf.system import System

__all__ = ["PlanResult", "plan_layouts"]

_MBS = (1, 2, 4, 8)
_VP = (1, 2, 3, 4, 6, 8, 12, 16)
_CP = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class PlanResult:
    """The ranked layouts that fit, and what happened to the others."""

    table: pl.DataFrame  # feasible layouts, fastest first: degrees, knobs, step time, MFU, memory, breakdown
    searched: int  # candidates enumerated (before divisibility and memory filters)
    invalid: int  # broke a divisibility rule
    out_of_memory: int  # valid but over the GPU's memory
    lost_to: dict[str, int] = field(default_factory=dict)  # feasible non-winners by their costliest component
    seconds: float = 0.0

    @property
    def best(self) -> Layout:
        """The fastest feasible layout; ConfigError when nothing fits."""
        if self.table.is_empty():
            raise ConfigError("no layout fits: add GPUs, lower the micro-batch or pick a GPU with more memory")
        row = self.table.row(0, named=True)
        return Layout(
            tp=row["tp"],
            pp=row["pp"],
            dp=row["dp"],
            cp=row["cp"],
            mbs=row["mbs"],
            vp=row["vp"],
            recompute=row["recompute"],
            ep=row["ep"],
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _expert_degrees(model: ModelSpec, ranks: int, max_ep: int | None) -> list[int]:
    """EP degrees for ``ranks`` DP x CP ranks: powers of two dividing both them and the experts (1 if dense)."""
    if not model.is_moe:
        return [1]
    limit = min(model.experts, ranks, max_ep or model.experts)
    out, ep = [], 1
    while ep <= limit:
        if ranks % ep == 0 and model.experts % ep == 0:
            out.append(ep)
        ep *= 2
    return out


def _candidates(
    model: ModelSpec,
    gpus: int,
    max_tp: int,
    recompute: tuple[Recompute, ...],
    max_cp: int,
    max_ep: int | None = None,
) -> dict[str, np.ndarray]:
    rows = []
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= max_tp and gpus % t == 0]
    for tp in tps:
        for cp in (c for c in _CP if c <= max_cp and gpus % (tp * c) == 0):
            for pp in _divisors(gpus // (tp * cp)):
                if pp > model.layers:
                    break
                dp = gpus // (tp * cp * pp)
                for ep in _expert_degrees(model, dp * cp, max_ep):
                    rows.append((tp, cp, pp, dp, ep))
    if not rows:
        raise ConfigError(f"{gpus} GPUs admit no TP x CP x PP x DP split")
    base = np.array(rows, dtype=np.int64)
    n_base = len(base)
    mbs = np.array(_MBS)
    vp = np.array(_VP)
    rc = np.array([RECOMPUTE_MODES.index(r) for r in recompute])
    idx, m_i, v_i, r_i = np.meshgrid(
        np.arange(n_base), np.arange(len(mbs)), np.arange(len(vp)), np.arange(len(rc)), indexing="ij"
    )
    idx, m_i, v_i, r_i = (a.ravel() for a in (idx, m_i, v_i, r_i))
    return {
        "tp": base[idx, 0],
        "cp": base[idx, 1],
        "pp": base[idx, 2],
        "dp": base[idx, 3],
        "ep": base[idx, 4],
        "mbs": mbs[m_i],
        "vp": vp[v_i],
        "rc": rc[r_i],
    }


def _valid(model: ModelSpec, gbs: int, seq: int, c: dict[str, np.ndarray], edge_chunks: int = 0) -> np.ndarray:
    ok = (model.heads % c["tp"] == 0) & (seq % c["cp"] == 0)
    ok &= gbs % (c["dp"] * c["mbs"]) == 0
    ok &= (c["vp"] == 1) | ((c["pp"] > 1) & (c["pp"] * c["vp"] <= model.layers + edge_chunks))
    # interleaving is only worth its extra send/recv when it splits layers evenly; with ``edge_chunks = 2``
    # (model revision 2) also when the first chunk holds only the embedding and the last only the output
    # layer, as Llama 3 405B's 126 layers in 16 x 8 chunks (arXiv 2407.21783 section 3.3.2)
    even = model.layers % (c["pp"] * c["vp"]) == 0
    if edge_chunks:
        even |= (model.layers + edge_chunks) % (c["pp"] * c["vp"]) == 0
    ok &= (c["vp"] == 1) | even
    # the interleaved schedule needs the micro-batch count to be a multiple of the pipeline depth (Narayanan et al.
    # 2021, section 2.2.2; Megatron-LM asserts it)
    ok &= (c["vp"] == 1) | ((gbs // np.maximum(c["dp"] * c["mbs"], 1)) % c["pp"] == 0)
    kv = model.kv_heads_eff
    ok &= (kv % c["tp"] == 0) | (c["tp"] % kv == 0)
    return ok


def plan_layouts(
    model: ModelSpec,
    system: System,
    gpus: int,
    gbs: int,
    seq: int | None = None,
    options: TrainOptions | None = None,
    efficiency: Efficiency | None = None,
    top: int = 10,
    recompute: tuple[Recompute, ...] = RECOMPUTE_MODES,
    max_tp: int | None = None,
    max_cp: int | None = None,
    max_ep: int | None = None,
) -> PlanResult:
    """Search all layouts of ``model`` on ``gpus`` GPUs at global batch ``gbs`` sequences; rank the fits.

    TP stays inside a node by default (``max_tp`` = GPUs per node); CP is considered for sequences of
    8K tokens and more (``max_cp``); EP (MoE models only) takes every power of two that divides the experts and
    the DP x CP ranks, up to ``max_ep``.
    """
    start = time.perf_counter()
    s = int(seq or model.seq)
    if gpus < 1 or gbs < 1:
        raise ConfigError("--gpus and the global batch must be positive")
    max_tp = max_tp or system.gpus_per_node
    max_cp = max_cp if max_cp is not None else (32 if s >= 8192 else 1)
    interleaved = True
    if options is not None and options.stack:  # search only what the training stack can run
        from gpufleet.perf.stacks import get_stack

        stack = get_stack(options.stack)
        recompute = tuple(r for r in recompute if r in stack.recompute) or recompute
        interleaved = stack.interleaved
    cands = _candidates(model, gpus, max_tp, recompute, max_cp, max_ep)
    if not interleaved:
        cands = {k: v[cands["vp"] == 1] for k, v in cands.items()}
    searched = len(cands["tp"])
    edge = 2 if (efficiency or default_efficiency()).software.revision >= 2 else 0
    valid = _valid(model, gbs, s, cands, edge)
    c = {k: v[valid] for k, v in cands.items()}
    out = evaluate(
        model,
        system,
        gbs,
        c["tp"],
        c["pp"],
        c["dp"],
        c["cp"],
        c["mbs"],
        c["vp"],
        c["rc"],
        s,
        options,
        efficiency,
        ep=c["ep"],
    )
    fits = out["memory_gb"] <= system.gpu.memory_gb
    order = np.argsort(out["step_time_s"][fits], kind="stable")
    keep = {k: v[fits][order] for k, v in c.items()}
    res = {k: np.broadcast_to(v, fits.shape)[fits][order] for k, v in out.items()}
    lost_to: dict[str, int] = {}
    if len(order) > 1:
        delta = np.stack([res[k][1:] - res[k][0] for k in BREAKDOWN_KEYS])
        names = np.array(["recompute / compute" if k == "compute" else k for k in BREAKDOWN_KEYS])
        worst = names[np.argmax(delta, axis=0)]
        labels, counts = np.unique(worst, return_counts=True)
        lost_to = {str(k): int(v) for k, v in sorted(zip(labels, counts, strict=True), key=lambda kv: -kv[1])}
    n = min(top, len(order))
    table = pl.DataFrame(
        {
            "rank": np.arange(1, n + 1),
            "tp": keep["tp"][:n],
            "pp": keep["pp"][:n],
            "dp": keep["dp"][:n],
            "cp": keep["cp"][:n],
            "ep": keep["ep"][:n],
            "mbs": keep["mbs"][:n],
            "vp": keep["vp"][:n],
            "recompute": [RECOMPUTE_MODES[i] for i in keep["rc"][:n]],
            "step_time_s": res["step_time_s"][:n],
            "mfu": res["mfu"][:n],
            "memory_gb": res["memory_gb"][:n],
            **{k: res[k][:n] for k in BREAKDOWN_KEYS},
        }
    )
    return PlanResult(
        table=table,
        searched=searched,
        invalid=int((~valid).sum()),
        out_of_memory=int((~fits).sum()),
        lost_to=lost_to,
        seconds=time.perf_counter() - start,
    )
