"""The simulator's network model: link loads, contention ratios, re-rating only touched jobs, engine hooks."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from gpufleet.perf.contention import DEEPSHARE_MODELS, ContentionModel
from gpufleet.sched.candidates import SLOTS, candidate_placements, spread_placement
from gpufleet.sched.policy import make_policy
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.network import JobComm, NetworkState, network_for
from gpufleet.sim.partition import Partition
from gpufleet.sim.run import RunSpec, run_one
from gpufleet.sim.workload import Workload, partitions_for
from gpufleet.spec.loader import cluster_from_dict

MODEL = ContentionModel.default()


def _cluster(nodes: int = 4, per_rack: int = 4, oversub: float = 1.0, nic: str = "ib-edr"):
    return cluster_from_dict(
        {
            "name": "t",
            "network": {"oversubscription": oversub},
            "pools": [
                {
                    "name": "train",
                    "kind": "training",
                    "gpu": "v100",
                    "gpus_per_node": 8,
                    "nodes": nodes,
                    "nic": nic,
                    "nodes_per_rack": per_rack,
                }
            ],
        }
    )


def _mix(seed: int, n: int = 64) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    models = rng.choice(DEEPSHARE_MODELS, size=n, p=[0.125, 0.125, 0.25, 0.125, 0.125, 0.25])
    gpus = rng.choice([2, 4, 8], size=n)
    return pl.DataFrame(
        {
            "job_id": [str(i) for i in range(n)],
            "submit_s": np.sort(rng.uniform(0, 3600, n)),
            "duration_s": [MODEL.duration_s(m, int(g)) for m, g in zip(models, gpus, strict=True)],
            "num_gpus": gpus,
            "model": models,
        }
    )


def _state(cluster, n_jobs: int, rng: np.random.Generator) -> NetworkState:
    parts = partitions_for(cluster)
    prof = list(rng.choice(DEEPSHARE_MODELS, size=n_jobs))
    comm = JobComm(prof, rng.uniform(0.5, 2.0, n_jobs))
    gpus = [int(x) for x in rng.choice([2, 4, 8], size=n_jobs)]
    pools = list(cluster.pools)
    return NetworkState(parts, pools, cluster.network.oversubscription, comm, gpus)


def _brute_ratio(net: NetworkState, j: int) -> float:
    """The ratio recomputed from scratch: sum the other jobs' intensities on each link of j."""
    if net.s.get(j, 0.0) == 0.0:
        return 1.0
    worst = 0.0
    for link in net.links[j]:
        total = sum(net.on_link[link].values())
        x = max(0.0, total - net.cap[link]) if net.uplink[link] else total - net.on_link[link][j]
        worst = max(worst, x / net.cap[link])
    return 1.0 / (1.0 + net.s[j] * worst)


@pytest.mark.parametrize("oversub", [1.0, 8.0])
def test_only_touched_jobs_change_and_ratios_match_a_recompute(oversub: float) -> None:
    rng = np.random.default_rng(3)
    cluster = _cluster(nodes=8, per_rack=2, oversub=oversub)
    net = _state(cluster, 40, rng)
    running: dict[int, list] = {}
    current: dict[int, float] = {}
    for step in range(300):
        if running and (rng.random() < 0.45 or len(running) > 25):
            j = int(rng.choice(list(running)))
            del running[j]
            touched = set(net.detach(j))
            current.pop(j)
        else:
            free = [j for j in range(40) if j not in running]
            j = int(rng.choice(free))
            nodes = rng.choice(8, size=int(rng.integers(1, 5)), replace=False)
            alloc = [(int(n), 1) for n in nodes]
            running[j] = alloc
            touched = set(net.attach(j, 0, alloc))
            net.rate(j)
            current[j] = net.ratio(j)
        for k in running:
            fresh = _brute_ratio(net, k)
            if k in touched:
                net.rate(k)
                current[k] = net.ratio(k)
            # a job left alone keeps its ratio, and that ratio is still right
            assert current[k] == pytest.approx(fresh, rel=1e-9, abs=1e-12), (step, k, touched)


def test_single_node_jobs_see_and_cause_no_contention() -> None:
    cluster = _cluster()
    net = _state(cluster, 3, np.random.default_rng(0))
    assert net.attach(0, 0, [(0, 2)]) == []
    net.rate(0)
    assert net.ratio(0) == 1.0
    net.attach(1, 0, [(0, 2), (1, 2)])
    net.rate(1)
    assert net.attach(2, 0, [(0, 4)]) == []
    assert net.ratio(1) == 1.0  # the single-node job beside it does not load the NIC


def test_uplink_slows_only_beyond_capacity() -> None:
    cluster = _cluster(nodes=4, per_rack=1, oversub=1.0)  # each node its own rack: uplink capacity 1 NIC
    parts = partitions_for(cluster)
    comm = JobComm(["MoE", "MoE"], np.array([1.0, 1.0]))
    net = NetworkState(parts, list(cluster.pools), 1.0, comm, [8, 8])
    net.attach(0, 0, [(0, 4), (1, 4)])
    net.rate(0)
    assert net.ratio(0) == 1.0  # alone: its uplinks carry only its own traffic, under capacity
    net.attach(1, 0, [(2, 4), (3, 4)])
    assert net.ratio(0) == 1.0  # no shared link at all


def test_predict_matches_what_attach_then_does() -> None:
    rng = np.random.default_rng(1)
    cluster = _cluster(nodes=6, per_rack=3, oversub=4.0)
    net = _state(cluster, 10, rng)
    for j, alloc in enumerate([[(0, 2), (1, 2)], [(1, 2), (2, 2)], [(2, 4), (3, 4)]]):
        net.attach(j, 0, alloc)
        net.rate(j)
    alloc = [(1, 2), (3, 2), (4, 2)]
    before = {k: net.ratio(k) for k in range(3)}
    speed, own, harm = net.predict(5, 0, alloc)
    net.attach(5, 0, alloc)
    assert net.rate(5) == pytest.approx(speed)
    assert net.ratio(5) == pytest.approx(own)
    after = {k: net.ratio(k) for k in range(3)}
    expected = sum(net.gpus[k] * net.base_speed[k] * (before[k] - after[k]) for k in range(3))
    assert harm == pytest.approx(expected)


def test_two_jobs_sharing_both_nodes_finish_at_the_predicted_rate() -> None:
    cluster = _cluster(nodes=2, nic="ib-edr")
    dur = 3600.0
    jobs = pl.DataFrame(
        {
            "job_id": ["a", "b"],
            "submit_s": [0.0, 0.0],
            "duration_s": [dur, dur],
            "num_gpus": [8, 8],
            "model": ["MoE", "FSDP"],
        }
    )
    res = run_one(RunSpec("srtf-spread", jobs, cluster, SimConfig(network=True, debug=True)))
    gbps = 100.0
    ratios = {}
    for me, other in (("MoE", "FSDP"), ("FSDP", "MoE")):
        s = MODEL.sensitivity(me, 8, 2, gbps)
        p = MODEL.intensity(other, 8, 2, gbps)
        ratios[me] = 1.0 / (1.0 + s * p)
    beta = MODEL.reference_gbps / gbps  # the spread's extra (network) time shrinks on the faster NIC
    base = {m: 1.0 / (1.0 + (1.0 / MODEL.relative_speed(m, 8, 2, 8) - 1.0) * beta) for m in ("MoE", "FSDP")}
    speed = {m: base[m] * ratios[m] for m in base}
    first = min(speed, key=lambda m: dur / speed[m])
    second = "FSDP" if first == "MoE" else "MoE"
    t1 = dur / speed[first]
    done2 = t1 * speed[second]
    t2 = t1 + (dur - done2) / base[second]  # alone after the first finishes: no contention
    finish = dict(zip(res.jobs["job_id"], res.jobs["finish_s"], strict=True))
    name = {"MoE": "a", "FSDP": "b"}
    assert finish[name[first]] == pytest.approx(t1, rel=1e-9)
    assert finish[name[second]] == pytest.approx(t2, rel=1e-9)
    assert res.summary["contention_gpu_h"] > 0


@pytest.mark.parametrize(
    "policy", ["las", "srtf", "tiresias", "fifo", "contention", "random", "las-spread", "srtf-spread"]
)
def test_every_policy_finishes_a_mix_with_consistent_state(policy: str) -> None:
    jobs = _mix(0)
    res = run_one(RunSpec(policy, jobs, _cluster(), SimConfig(network=True, debug=True)))
    assert res.summary["finished"] == jobs.height
    assert (res.jobs["finish_s"] >= res.jobs["submit_s"] + res.jobs["duration_s"] - 1e-6).all()


def test_network_off_leaves_the_simulator_unchanged() -> None:
    jobs = _mix(1)
    a = run_one(RunSpec("srtf", jobs, _cluster(), SimConfig()))
    b = run_one(RunSpec("srtf", jobs.drop("model"), _cluster(), SimConfig()))
    assert a.jobs["finish_s"].to_list() == b.jobs["finish_s"].to_list()
    assert "contention_gpu_h" not in a.summary


def test_contention_heuristic_avoids_contention_that_spread_placement_causes() -> None:
    jobs = _mix(2, 96).with_columns(pl.lit(0.0).alias("submit_s"))
    cluster = _cluster(nic="ib-edr")
    res = {
        p: run_one(RunSpec(p, jobs, cluster, SimConfig(network=True))).summary
        for p in ("contention", "srtf-spread", "random")
    }
    assert res["srtf-spread"]["multi_node_share"] > 0.95
    assert res["contention"]["contention_gpu_h"] < res["random"]["contention_gpu_h"]
    assert res["contention"]["avg_jct_s"] < res["srtf-spread"]["avg_jct_s"]


def test_missing_profiles_raise_a_clear_error() -> None:
    from gpufleet.errors import ConfigError

    jobs = _mix(0).drop("model")
    with pytest.raises(ConfigError, match="model"):
        run_one(RunSpec("srtf", jobs, _cluster(), SimConfig(network=True)))
    with pytest.raises(ConfigError, match="unknown communication profile"):
        run_one(
            RunSpec("srtf", jobs.with_columns(pl.lit("resnet").alias("model")), _cluster(), SimConfig(network=True))
        )


# ---------------------------------------------------------------------------------------------- candidates
def test_candidates_cover_each_shape_and_respect_free_gpus() -> None:
    part = Partition("p", "v100", 4, 8)
    part.take([(0, 6), (1, 2)])  # free: 2, 6, 8, 8
    cands = candidate_placements(part, 8)
    by_slot = dict(zip(SLOTS, cands, strict=True))
    assert by_slot[(1, "pack")] == [(2, 8)]
    assert by_slot[(2, "pack")] == [(1, 4), (2, 4)]  # best fit: the 6-free node first
    assert by_slot[(4, "pack")] == [(0, 2), (1, 2), (2, 2), (3, 2)]
    for c in cands:
        if c is not None:
            assert sum(g for _, g in c) == 8
            assert all(part.free[n] >= g for n, g in c)
    assert part.total_free == 24  # nothing taken


def test_net_strategy_prefers_quiet_nics_for_multi_node_and_busy_ones_for_single_node() -> None:
    cluster = _cluster(nodes=4)
    parts = partitions_for(cluster)
    net = NetworkState(parts, list(cluster.pools), 1.0, JobComm(["MoE", None], np.ones(2)), [4, 2])
    parts[0].take([(0, 2), (1, 2)])
    net.attach(0, 0, [(0, 2), (1, 2)])
    cands = dict(zip(SLOTS, candidate_placements(parts[0], 2, net, 0), strict=True))
    assert cands[(2, "net")] == [(2, 1), (3, 1)]
    assert cands[(1, "net")][0][0] in (0, 1)


def test_spread_placement_never_uses_one_node_when_a_spread_fits() -> None:
    part = Partition("p", "v100", 4, 8)
    assert spread_placement(part, 8) == [(0, 2), (1, 2), (2, 2), (3, 2)]
    assert spread_placement(part, 2) == [(0, 1), (1, 1)]
    assert spread_placement(part, 1) == [(0, 1)]
    assert spread_placement(part, 40) is None


def test_simulator_engine_accepts_a_network_state_directly() -> None:
    jobs = _mix(3, 24)
    cluster = _cluster()
    parts = partitions_for(cluster)
    net = network_for(cluster, parts, jobs)
    sim = Simulator(
        Workload.from_frame(jobs), parts, make_policy("contention"), SimConfig(network=True, debug=True), network=net
    )
    res = sim.run()
    assert res.summary["finished"] == 24
    assert not net.links  # every job detached at the end
    assert all(v == 0.0 for v in net.load)


def test_waiting_heuristic_never_stalls() -> None:
    jobs = _mix(4, 48).with_columns(pl.lit(0.0).alias("submit_s"))
    res = run_one(RunSpec("contention", jobs, _cluster(), SimConfig(network=True, debug=True), {"wait_below": 0.99}))
    assert res.summary["finished"] == 48
    assert res.summary["multi_node_share"] < 0.05  # it waited for single nodes instead of spreading


def test_srsf_order_starts_the_least_remaining_service_first() -> None:
    """Ordered by GPUs x remaining time, a 2-GPU job of 3 h starts before an 8-GPU job of 1 h (srtf: the other
    way round) when only one of them fits."""
    jobs = pl.DataFrame(
        {
            "job_id": ["blocker", "wide-short", "narrow-long"],
            "submit_s": [0.0, 1.0, 1.0],
            "duration_s": [600.0, 3600.0, 3 * 3600.0],
            "num_gpus": [24, 8, 2],
            "model": ["MobileNetV3"] * 3,
        }
    )
    starts = {}
    for order in ("srtf", "srsf"):
        res = run_one(
            RunSpec("contention", jobs, _cluster(nodes=4), SimConfig(network=True, debug=True), {"order": order})
        )
        assert res.summary["finished"] == 3
        starts[order] = dict(zip(res.jobs["job_id"].to_list(), res.jobs["start_s"].to_list(), strict=True))
    assert starts["srtf"]["wide-short"] < starts["srtf"]["narrow-long"]
    assert starts["srsf"]["narrow-long"] < starts["srsf"]["wide-short"]


@pytest.mark.parametrize("oversub", [1.0, 3.0])
def test_predict_matches_attach_over_random_states(oversub: float) -> None:
    """predict's own speed and the harm it reports equal what attaching then does, including when uplinks stay
    under capacity (the case predict skips) and when they go over it."""
    rng = np.random.default_rng(7)
    cluster = _cluster(nodes=8, per_rack=2, oversub=oversub)
    net = _state(cluster, 40, rng)
    running: set[int] = set()
    checked = 0
    for _ in range(200):
        free = [j for j in range(40) if j not in running]
        j = int(rng.choice(free))
        nodes = rng.choice(8, size=int(rng.integers(2, 5)), replace=False)
        alloc = [(int(n), 1) for n in nodes]
        before = {k: net.ratio(k) for k in running}
        speed, own, harm = net.predict(j, 0, alloc)
        net.attach(j, 0, alloc)
        assert net.rate(j) == pytest.approx(speed, rel=1e-9)
        assert net.ratio(j) == pytest.approx(own, rel=1e-9)
        after = {k: net.ratio(k) for k in running}
        expected = sum(net.gpus[k] * net.base_speed[k] * (before[k] - after[k]) for k in running)
        assert harm == pytest.approx(expected, rel=1e-9, abs=1e-12)
        checked += harm > 0
        if len(running) < 15 or rng.random() < 0.5:
            running.add(j)
        else:
            net.detach(j)
        if len(running) > 12 and rng.random() < 0.4:
            k = int(rng.choice(sorted(running)))
            running.discard(k)
            net.detach(k)
    assert checked > 20  # the random states did make jobs slow each other


@pytest.mark.parametrize("policy", ["aryl", "aryl-base", "aryl-elastic", "aryl-loan"])
def test_the_aryl_policies_run_with_the_network(policy: str) -> None:
    jobs = _mix(3).rename({"model": "comm_profile"})  # Aryl reads 'model' as a perf-catalog model (its curve)
    res = run_one(RunSpec(policy, jobs, _cluster(), SimConfig(network=True, debug=True)))
    assert res.summary["finished"] == jobs.height
    assert res.summary["contention_gpu_h"] >= 0.0 and 0.0 <= res.summary["multi_node_share"] <= 1.0


def test_aryl_jobs_sharing_a_nic_slow_each_other_down() -> None:
    # 3 nodes of 8 GPUs; two jobs of 3 workers x 4 GPUs. Best fit puts a on nodes 0, 0, 1 and b on 1, 2, 2:
    # both cross node 1's NIC
    jobs = pl.DataFrame(
        {
            "job_id": ["a", "b"],
            "submit_s": [0.0, 0.0],
            "duration_s": [10_000.0, 10_000.0],
            "num_gpus": [12, 12],
            "min_workers": [3, 3],
            "max_workers": [3, 3],
            "gpus_per_worker": [4, 4],
            "comm_profile": ["MoE", "MoE"],
        }
    )
    cluster = _cluster(nodes=3)
    off = run_one(RunSpec("aryl-base", jobs, cluster, SimConfig(debug=True)))
    on = run_one(RunSpec("aryl-base", jobs, cluster, SimConfig(network=True, debug=True)))
    assert off.jobs["finish_s"].to_list() == [10_000.0, 10_000.0]
    assert all(f > 10_000.0 for f in on.jobs["finish_s"].to_list())
    assert on.summary["contention_gpu_h"] > 0 and on.summary["multi_node_share"] == 1.0
