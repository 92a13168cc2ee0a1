"""Training across node groups with different NICs (Holmes, arXiv 2312.03549), as a placement planner.

A cluster file whose training pools share a GPU type but differ in NIC (InfiniBand, RoCE, Ethernet) is
a set of *groups*. RDMA does not cross groups of different fabrics, so traffic between groups runs
over TCP at the slower group's line rate. Holmes' placement, modelled here:

* tensor parallelism stays inside a node;
* every data-parallel group lives inside one group (its gradients never cross the slow link);
* each group holds a contiguous block of pipeline stages, so only the stage boundaries between
  groups cross the slow link;
* layers are split unevenly: stages whose DP reduction is slower get fewer layers, so that all
  stages finish a step together (Holmes' self-adapting pipeline partition).

It is compared with naive uniform placement and with an all-RDMA cluster of the same size (every node on
the best group's NIC). Naive placement is what a homogeneous planner does: it picks the best layout for the
NIC the cluster advertises (its best group's), and Megatron's rank order then spreads that layout over all
nodes, so its DP rings and pipeline sends cross groups and run at the cross-group TCP rate, with layers
split evenly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import polars as pl

from gpufleet.errors import ConfigError
from gpufleet.perf.efficiency import Efficiency, default_efficiency
from gpufleet.perf.flops import RECOMPUTE_MODES, model_flops_per_step, params_per_layer
from gpufleet.perf.model_spec import ModelSpec
from gpufleet.perf.options import TrainOptions
from gpufleet.perf.step import evaluate
from gpufleet.perf.system import System
from gpufleet.spec import ClusterSpec, get_nic
from gpufleet.spec.cluster import Pool

__all__ = ["HeteroResult", "plan_hetero"]


@dataclass(frozen=True)
class HeteroResult:
    """Predicted throughput of Holmes placement vs naive placement vs all-RDMA, and the stage plan."""

    summary: pl.DataFrame  # placement, layout, step_time_s, tokens_per_s, tflops_per_gpu, mfu, vs_naive
    table: pl.DataFrame  # Holmes stage plan: group, nic, gpus, stages, layers per stage, dp


def _groups(cluster: ClusterSpec) -> list[Pool]:
    pools = list(cluster.training_pools or cluster.pools)
    gpus = {p.gpu for p in pools}
    if len(gpus) != 1:
        raise ConfigError(f"heterogeneous planning needs one GPU type across pools, found {sorted(gpus)}")
    if len({p.gpus_per_node for p in pools}) != 1:
        raise ConfigError("heterogeneous planning needs the same GPUs per node in every pool")
    return pools


def _cross_nic(pools: list[Pool]) -> str:
    """The NIC class of traffic between groups: TCP at the slowest line rate when fabrics differ."""
    if len({p.nic_spec.kind for p in pools}) == 1 and len({p.nic for p in pools}) == 1:
        return pools[0].nic
    slowest = min(p.nic_spec.gbps for p in pools)
    return "eth-100g" if slowest >= 100 else "eth-25g"


def _system(pool: Pool, nic: str | None = None) -> System:
    return System(pool.gpu_spec, get_nic(nic or pool.nic), pool.gpus_per_node, pool.nics_per_node)


def _cross_system(pools: list[Pool]) -> System:
    """The fabric seen by traffic that crosses groups: TCP, as wide as the thinnest group's nodes."""
    nic = get_nic(_cross_nic(pools))
    nics = max(1, int(min(p.node_gbps for p in pools) // nic.gbps))
    return System(pools[0].gpu_spec, nic, pools[0].gpus_per_node, nics)


def _split_layers(layers: int, weights: np.ndarray) -> np.ndarray:
    """Integer layers per stage proportional to ``weights`` (at least one each), summing to ``layers``."""
    raw = weights / weights.sum() * layers
    out = np.maximum(np.floor(raw).astype(int), 1)
    while out.sum() < layers:
        out[np.argmax(raw - out)] += 1
    while out.sum() > layers:
        out[np.argmax(out - raw)] -= 1
    return out


def _uniform(
    model: ModelSpec,
    system: System,
    gbs: int,
    seq: int,
    gpus: int,
    options: TrainOptions,
    eff: Efficiency,
    run_on: System,
) -> tuple[float, float, str]:
    """Best layout of a homogeneous search on ``system``: its step time there, on ``run_on``, and its name."""
    from gpufleet.perf.planner import plan_layouts

    res = plan_layouts(model, system, gpus, gbs, seq, options, eff, top=1, max_cp=1)
    best = res.table.row(0, named=True)
    rc = RECOMPUTE_MODES.index(best["recompute"])
    out = evaluate(
        model, run_on, gbs, best["tp"], best["pp"], best["dp"], 1, best["mbs"], best["vp"], rc, seq, options, eff
    )
    elsewhere = float(np.asarray(out["step_time_s"]).reshape(-1)[0])
    name = f"TP{best['tp']} PP{best['pp']} DP{best['dp']} mbs{best['mbs']} v{best['vp']} {best['recompute']}"
    return float(best["step_time_s"]), elsewhere, name


def _holmes(model: ModelSpec, pools: list[Pool], gbs: int, seq: int, options: TrainOptions, eff: Efficiency):
    """Search TP, DP, micro-batch and recompute for Holmes placement; returns (step, layout, plan rows)."""
    per_node = pools[0].gpus_per_node
    sizes = [p.total_gpus for p in pools]
    cross = _cross_system(pools)
    best: tuple[float, str, list[dict]] | None = None
    for tp, mbs, rc_name in itertools.product((1, 2, 4, 8), (1, 2, 4), RECOMPUTE_MODES):
        if tp > per_node or model.heads % tp:
            continue
        for dp in range(1, min(sizes) // tp + 1):
            if any(n % (tp * dp) for n in sizes) or gbs % (dp * mbs):
                continue
            stages = [n // (tp * dp) for n in sizes]
            total_pp = sum(stages)
            if total_pp > model.layers:
                continue
            rc = RECOMPUTE_MODES.index(rc_name)
            pieces = [
                {
                    k: float(np.asarray(v).reshape(-1)[0])
                    for k, v in evaluate(
                        model, _system(p), gbs, tp, total_pp, dp, 1, mbs, 1, rc, seq, options, eff
                    ).items()
                }
                for p in pools
            ]
            m = gbs / (dp * mbs)
            # per stage: m micro-batches of L layers, plus that stage's DP reduction (∝ its layers)
            per_layer_dp = [pc["dp_s"] * params_per_layer(model) / max(pc["stage_params"], 1.0) for pc in pieces]
            cost = np.concatenate(
                [np.full(s, m * pc["layer_s"] + d) for s, pc, d in zip(stages, pieces, per_layer_dp, strict=True)]
            )
            layers = _split_layers(model.layers, 1.0 / cost)
            stage_time = layers * cost
            stage_time[-1] += m * pieces[-1]["logits_s"]
            # a group boundary is one more pipeline stage: the TCP link, shared by the tp x dp GPUs that
            # send at that boundary (full duplex: activations and gradients flow at the same time)
            senders = min(tp * dp, per_node)
            link_bw = cross.nics_per_node * cross.nic.gbps / 8 * 1e9 * eff.for_nic(cross.nic).efficiency / senders
            # each TP rank sends its 1/tp slice across the link (the NVLink re-gather is in p2p_s below)
            act = mbs * seq * model.hidden * 2.0 / tp
            t_link = act / link_bw + eff.for_nic(cross.nic).alpha_us * 1e-6 if len(pools) > 1 else 0.0
            t_p2p = max(pc["p2p_s"] for pc in pieces)
            t_mb = max(float(stage_time.max()) / m, t_link)
            fill = (total_pp - 1) * float(stage_time.max()) / m + (len(pools) - 1) * t_link
            step = m * t_mb + fill + 2.0 * (m + total_pp - 1) * t_p2p + eff.software.step_overhead_s
            # memory: the stage with the most layers, as a homogeneous pipeline of that depth
            deepest = model.with_overrides(layers=int(layers.max()) * total_pp)
            mem = max(
                float(
                    np.asarray(
                        evaluate(deepest, _system(p), gbs, tp, total_pp, dp, 1, mbs, 1, rc, seq, options, eff)[
                            "memory_gb"
                        ]
                    ).reshape(-1)[0]
                )
                for p in pools
            )
            if mem > pools[0].gpu_spec.memory_gb:
                continue
            if best is None or step < best[0]:
                plan, start = [], 0
                for pool, s in zip(pools, stages, strict=True):
                    plan.append(
                        {
                            "group": pool.name,
                            "nic": pool.nic,
                            "gpus": pool.total_gpus,
                            "stages": s,
                            "layers_per_stage": " ".join(str(x) for x in layers[start : start + s]),
                            "dp": dp,
                            "tp": tp,
                        }
                    )
                    start += s
                best = (step, f"TP{tp} PP{total_pp} DP{dp} mbs{mbs} {rc_name} (uneven)", plan)
    if best is None:
        raise ConfigError("no Holmes placement fits in memory; add GPUs or pick a smaller model")
    return best


def plan_hetero(
    model: ModelSpec,
    cluster: ClusterSpec,
    gbs: int,
    seq: int | None = None,
    options: TrainOptions | None = None,
    efficiency: Efficiency | None = None,
    top: int = 5,
) -> HeteroResult:
    """Plan ``model`` on a cluster of node groups with different NICs; compare three placements."""
    del top  # one best plan per placement
    pools = _groups(cluster)
    s = int(seq or model.seq)
    opts = options or TrainOptions()
    eff = efficiency or default_efficiency()
    gpus = sum(p.total_gpus for p in pools)
    holmes_step, holmes_layout, plan = _holmes(model, pools, gbs, s, opts, eff)
    best_pool = max(pools, key=lambda p: (p.nic_spec.kind != "ethernet", p.nic_spec.gbps))
    # one search on the best group's NIC: all-RDMA runs its layout there, naive placement on the mixed fabric
    rdma_step, naive_step, rdma_layout = _uniform(
        model, _system(best_pool), gbs, s, gpus, opts, eff, _cross_system(pools)
    )
    naive_layout = rdma_layout
    flops = model_flops_per_step(model, gbs, s)
    peak = pools[0].gpu_spec.mixed_precision_tflops * 1e12
    rows = []
    for name, step, layout in (
        ("naive uniform", naive_step, naive_layout),
        ("holmes", holmes_step, holmes_layout),
        ("all-RDMA (same size)", rdma_step, rdma_layout),
    ):
        rows.append(
            {
                "placement": name,
                "layout": layout,
                "step_time_s": step,
                "tokens_per_s": gbs * s / step,
                "tflops_per_gpu": flops / step / gpus / 1e12,
                "mfu": flops / step / gpus / peak,
                "vs_naive": naive_step / step,
            }
        )
    return HeteroResult(summary=pl.DataFrame(rows), table=pl.DataFrame(plan))
