"""The guarded ``rl`` placement: it never takes a candidate predicted costlier than consolidate's, and waits only
by its rule; the ``rl`` alias keeps the unguarded policy."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from helpers import deepshare_arrivals

from gpufleet.sched.placement import rl as rl_mod
from gpufleet.sched.placement.rl import ANCHOR, guarded_mask, wait_budget
from gpufleet.sched.policy import make_policy, make_scheduler
from gpufleet.sched.rl_features import HEURISTIC, WAIT
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.network import network_for
from gpufleet.sim.workload import Workload, partitions_for
from gpufleet.spec.loader import cluster_from_dict


def _cluster(nodes: int = 6):
    return cluster_from_dict(
        {
            "name": "t",
            "network": {"oversubscription": 1.0},
            "pools": [
                {
                    "name": "train",
                    "kind": "training",
                    "gpu": "v100",
                    "gpus_per_node": 8,
                    "nodes": nodes,
                    "nic": "ib-edr",
                    "nodes_per_rack": 3,
                }
            ],
        }
    )


def _jobs(n: int = 60, seed: int = 3) -> pl.DataFrame:
    """Jobs of 2 to 16 GPUs with DeepShare models arriving over four hours, so that queues form and jobs spread."""
    return deepshare_arrivals(np.random.default_rng(seed), n, hours=4)


def _run(label: str, placement_opts: dict | None = None, decider=None):
    """``label`` on the 6-node test cluster; a guarded rl treats it as a large partition unless told otherwise
    (``small_nodes`` 0, the default, said outright so that these tests do not hang on it) and holds under every
    order (``service_holds`` 1, so that the hold mechanics can be tested under las)."""
    spec = _cluster()
    jobs = _jobs()
    parts = partitions_for(spec)
    if placement_opts is not None and "rl" in label:
        placement_opts = {"small_nodes": 0.0, "service_holds": 1.0, **placement_opts}
    policy = make_scheduler(label, {}, placement_opts) if placement_opts is not None else make_policy(label)
    if decider is not None:
        policy.placer.decider = decider
    net = network_for(spec, parts, jobs)
    sim = Simulator(Workload.from_frame(jobs), parts, policy, SimConfig(network=True, debug=True), network=net)
    return sim.run(), policy


def test_guarded_mask_keeps_consolidate_and_only_cheaper_candidates() -> None:
    cands = [[(0, 4)], None, [(0, 2), (1, 2)], [(2, 2), (3, 2)], None, None, [(0, 2), (1, 2)]]
    # (speed, ratio, harm): slot 2 costs 0.4 GPUs, slot 3 costs 2.0, the anchor 1.0
    scores = [(1.0, 1.0, 0.0), None, (0.95, 0.95, 0.2), (0.6, 0.6, 0.4), None, None, (0.9, 0.9, 0.6)]
    mask, best = guarded_mask(cands, scores, 4, 0.0)
    assert mask[ANCHOR] and mask[0] and mask[2] and not mask[3]
    assert not mask[1] and not mask[WAIT] and mask[HEURISTIC]
    assert best == 1.0
    # a negative margin asks for a saving: slot 2 saves 0.6 GPU = 0.15 x 4, not 0.2 x 4; the anchor stays
    mask, best = guarded_mask(cands, scores, 4, -0.2)
    assert mask[ANCHOR] and mask[0] and not mask[2] and not mask[3]
    mask, best = guarded_mask([*cands[:6], None], [*scores[:6], None], 4, 0.0)
    assert not mask[ANCHOR] and mask[0] and best == 1.0  # no anchor: the cheapest candidates stay


def test_a_policy_that_asks_for_what_the_guard_refuses_gets_consolidate() -> None:
    """A decider that always asks to wait, with waiting ruled out, falls back to consolidate's plan every time."""
    base, _ = _run("srtf")
    ruled, pol = _run("srtf+rl", {"wait_below": 0.0, "margin": 0.0}, decider=lambda obs, mask: WAIT)
    assert pol.placer.waits == 0 and pol.placer.fallbacks == pol.placer.decisions > 0
    assert ruled.summary["finished"] == base.summary["finished"] == 60
    assert ruled.summary["avg_jct_s"] == pytest.approx(base.summary["avg_jct_s"], rel=1e-9)
    assert ruled.jobs["finish_s"].to_list() == base.jobs["finish_s"].to_list()
    # the default margin (-1) allows consolidate's plan only: with no wait either, no one is ever asked
    plain, pol = _run("srtf+rl", {"wait_below": 0.0}, decider=lambda obs, mask: WAIT)
    assert pol.placer.decisions == 0
    assert plain.jobs["finish_s"].to_list() == base.jobs["finish_s"].to_list()


def test_the_wait_rule_waits_only_when_even_the_best_slot_is_slow() -> None:
    never = lambda obs, mask: HEURISTIC  # noqa: E731
    _, strict = _run("las+rl", {"wait_below": 0.0}, decider=never)
    res, eager = _run("las+rl", {"wait_below": 1.01, "outlook": 0.0}, decider=never)
    assert strict.placer.waits == 0
    assert eager.placer.waits > 0  # spread placements run below full speed, and the rule then holds the job
    assert res.summary["finished"] == 60  # waiting only while something runs never stalls the run
    # the model decides when the rule is off: a decider that never waits never does
    _, model = _run("las+rl", {"wait_below": 1.01, "outlook": 0.0, "wait_rule": 0.0}, decider=never)
    assert model.placer.waits == 0


def test_the_rl_alias_keeps_the_unguarded_policy() -> None:
    """The alias (srsf order) lets the model wait for any job no node fits, as it was trained; guarded, it cannot."""
    seen: list[bool] = []

    def wait_when_allowed(obs: np.ndarray, mask: np.ndarray) -> int:
        seen.append(bool(mask[WAIT]))
        return WAIT if mask[WAIT] else HEURISTIC

    assert float(make_policy("rl").placer.opts["guard"]) == 0.0
    assert float(make_scheduler("srtf+rl", {}, {}).placer.opts["guard"]) > 0
    res, pol = _run("rl", None, decider=wait_when_allowed)
    assert pol.waits > 0 and any(seen)
    assert res.summary["finished"] == 60


def test_the_wait_budget_is_what_a_slower_start_costs() -> None:
    assert wait_budget(1000.0, 1.0, 0.0, 8) == 0.0  # a full-speed plan: waiting cannot pay
    assert wait_budget(1000.0, 0.5, 0.0, 8) == pytest.approx(1000.0)  # twice as long: it loses its remaining time
    # taking 2 GPUs' worth of speed from neighbours over its 2,000 s run costs 2/8 of that per GPU of its own
    assert wait_budget(1000.0, 0.5, 2.0, 8) == pytest.approx(1000.0 + 2000.0 * 2.0 / 8.0)
    assert wait_budget(1000.0, 0.0, 0.0, 8) == float("inf")
    assert wait_budget(2000.0, 0.8, 1.0, 4) == pytest.approx(2 * wait_budget(1000.0, 0.8, 1.0, 4))


def test_a_job_is_held_only_while_its_waits_so_far_are_within_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the eager rule (any slowdown, any outlook), every hold comes with the waits so far below the budget of
    that decision; without the budget the same rule holds jobs more often."""
    budgets: list[float] = []
    holds: list[tuple[float, float]] = []

    def spy_budget(*args: float) -> float:
        budgets.append(rl_mod.wait_budget.__wrapped__(*args))  # type: ignore[attr-defined]
        return budgets[-1]

    spy_budget.__wrapped__ = rl_mod.wait_budget  # type: ignore[attr-defined]
    real_hold = rl_mod.RLPlacement._hold

    def spy_hold(self, j: int, p: int = 0) -> None:
        holds.append((self._waited.get(j, 0.0), budgets[-1]))
        real_hold(self, j, p)

    monkeypatch.setattr(rl_mod, "wait_budget", spy_budget)
    monkeypatch.setattr(rl_mod.RLPlacement, "_hold", spy_hold)
    eager = {"wait_below": 1.01, "outlook": 0.0}
    res, pol = _run("las+rl", eager)
    assert res.summary["finished"] == 60
    assert holds and all(waited < budget for waited, budget in holds)
    assert any(waited > 0 for waited, _ in holds)  # some jobs are held again, on what is left of their budget
    monkeypatch.undo()
    unbounded, free = _run("las+rl", {**eager, "budget": 0.0})
    assert unbounded.summary["finished"] == 60
    assert free.placer.waits > pol.placer.waits


def test_no_job_is_held_while_the_observed_network_pressure_is_below_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hold comes with the run's observed contention loss at or above ``pressure``; a gate no run reaches
    holds nothing and gives exactly consolidate's run."""
    seen: list[float] = []
    real_hold = rl_mod.RLPlacement._hold

    def spy_hold(self, j: int, p: int = 0) -> None:
        seen.append(self.pressure())
        real_hold(self, j, p)

    monkeypatch.setattr(rl_mod.RLPlacement, "_hold", spy_hold)
    eager = {"wait_below": 1.01, "outlook": 0.0}
    _, free = _run("las+rl", eager)
    assert free.placer.waits > 0
    seen.clear()
    res, gated = _run("las+rl", {**eager, "pressure": 0.02})
    assert res.summary["finished"] == 60
    assert 0.0 <= gated.placer.pressure() <= 1.0
    assert all(ps >= 0.02 for ps in seen) and len(seen) == gated.placer.waits < free.placer.waits
    base, _ = _run("las")
    never, shut = _run("las+rl", {**eager, "pressure": 0.999})
    assert shut.placer.waits == 0
    assert never.jobs["finish_s"].to_list() == base.jobs["finish_s"].to_list()


def test_no_job_bound_for_the_tail_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hold comes with the job's JCT if started now below the ``tail`` quantile of the finished jobs' JCTs."""
    holds: list[tuple[float, float]] = []
    real_hold = rl_mod.RLPlacement._hold

    def spy_hold(self, j: int, p: int = 0) -> None:
        sim = self.sim
        holds.append((sim.now - sim.submit[j] + sim.remaining[j], self.tail_jct()))
        real_hold(self, j, p)

    monkeypatch.setattr(rl_mod.RLPlacement, "_hold", spy_hold)
    monkeypatch.setattr(rl_mod._RunObserver, "MIN_FINISHED", 5)  # 60 jobs: let the quantile act early
    eager = {"wait_below": 1.01, "outlook": 0.0, "budget": 0.0}
    _, free = _run("las+rl", eager)
    holds.clear()
    res, guarded = _run("las+rl", {**eager, "tail": 0.9})
    assert res.summary["finished"] == 60
    assert holds and guarded.placer.waits < free.placer.waits
    # the speed of a spread plan is <= 1, so remaining / speed >= remaining: the bound checked here is looser
    assert all(jct < bound for jct, bound in holds)
    assert any(bound < float("inf") for _, bound in holds)  # the quantile was in force for some holds


def test_on_a_small_partition_the_job_takes_the_heuristics_node_set() -> None:
    """With ``small_nodes`` at least the partition's nodes and no waiting, every job gets the contention
    heuristic's node set: the run is the ``contention`` placement's; below that, consolidate's."""
    heur, _ = _run("las+contention", {})
    cons, _ = _run("las")
    small, _ = _run("las+rl", {"wait_below": 0.0, "small_nodes": 6, "small_rule": 1.0, "small_wait": -1.0})
    big, _ = _run("las+rl", {"wait_below": 0.0, "small_nodes": 5, "small_rule": 1.0, "small_wait": -1.0})
    assert heur.jobs["finish_s"].to_list() != cons.jobs["finish_s"].to_list()  # the two node choices differ here
    assert small.jobs["finish_s"].to_list() == heur.jobs["finish_s"].to_list()
    assert big.jobs["finish_s"].to_list() == cons.jobs["finish_s"].to_list()


def test_the_run_observer_integrates_the_contention_loss_between_samples() -> None:
    class Net:
        def __init__(self) -> None:
            self.loss = {0: 0.5, 1: 0.0}

        def lost(self, j: int) -> float:
            return self.loss[j]

    class Sim:
        def __init__(self) -> None:
            self.now = 0.0
            self.gpus = [8, 8]
            self.submit = [0.0, 0.0]
            self.finish = [float("nan"), float("nan")]
            self.network = Net()

        def running_jobs(self) -> list[int]:
            return [0, 1]

    sim, obs = Sim(), rl_mod._RunObserver()
    obs.sample(sim)
    assert obs.pressure(sim) == 0.0  # nothing integrated yet
    sim.now = 100.0
    obs.started(0)
    obs.sample(sim)
    assert obs.pressure(sim) == pytest.approx(0.25)  # half the speed of half the busy GPUs
    sim.finish[0] = 150.0
    sim.now = 200.0
    obs.sample(sim)
    assert obs.jcts == [150.0]
    assert obs.quantile(sim, 0.5) == float("inf")  # fewer than MIN_FINISHED


def test_a_small_partition_gets_consolidates_run() -> None:
    """With ``small_nodes`` 8, on a partition of at most 8 nodes nothing is held and every job takes consolidate's
    plan, even with a rule that would hold at any slowdown; with ``small_nodes`` 0 (the default) the same rule
    holds jobs on the same 6 nodes."""
    eager = {"wait_below": 1.01, "outlook": 0.0}
    base, _ = _run("las")
    plain, pol = _run("las+rl", {**eager, "small_nodes": 8.0})
    assert pol.placer.waits == 0
    assert plain.jobs["finish_s"].to_list() == base.jobs["finish_s"].to_list()
    _, held = _run("las+rl", eager)  # small_nodes 0: the 6 nodes are a large partition
    assert held.placer.waits > 0
    assert float(make_scheduler("las+rl", {}, {}).placer.opts["small_nodes"]) == 0.0


def _record_decisions(mp: pytest.MonkeyPatch) -> list[tuple[int, float, bool]]:
    """Spy on the guarded rule's decisions: the list it fills with (job, time, held) as the run goes."""
    decided: list[tuple[int, float, bool]] = []
    real_choose = rl_mod.RLPlacement._choose_guarded

    def spy_choose(self, j: int, *args: object) -> int | None:
        idx = real_choose(self, j, *args)
        decided.append((j, self.sim.now, idx is None))
        return idx

    mp.setattr(rl_mod.RLPlacement, "_choose_guarded", spy_choose)
    return decided


def _idle_holds() -> tuple[list[tuple[int, float]], list[tuple[int, float, bool]], int]:
    """The eager rule's run with ``conserve`` 1: the holds whose pass ended with the job's GPUs still free on its
    partition, every decision (job, time, held), and the jobs finished."""
    idle: list[tuple[int, float]] = []
    real_wake = rl_mod.RLPlacement.next_wakeup

    def spy_wake(self, now: float) -> float | None:
        sim = self.sim
        idle.extend((j, now) for j, p in self._held_now.items() if sim.parts[p].total_free >= sim.gpus[j])
        return real_wake(self, now)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rl_mod.RLPlacement, "next_wakeup", spy_wake)
        decided = _record_decisions(mp)
        res, _ = _run("las+rl", {"wait_below": 1.01, "outlook": 0.0, "budget": 0.0, "conserve": 1.0})
    return idle, decided, res.summary["finished"]


def test_with_conserve_a_hold_that_leaves_its_gpus_idle_is_undone_at_once() -> None:
    """conserve 1: a job held in a pass after which its GPUs are still free is decided again CONSERVE_DT later and
    not held then."""
    idle, decided, finished = _idle_holds()
    assert finished == 60
    assert idle, "the eager rule holds jobs whose GPUs then stay idle"
    redecided = 0
    for j, t in idle:
        again = [d for d in decided if d[0] == j and d[1] == pytest.approx(t + rl_mod.CONSERVE_DT, abs=1e-6)]
        redecided += bool(again)
        assert not any(held for _, _, held in again), f"job {j} held again though its GPUs stayed idle"
    # a better job may take the GPUs first in that pass (then it is not asked), but most are decided again
    assert redecided >= len(idle) / 2


def test_conserve_off_lets_idle_holds_stand() -> None:
    """Without conserve no pass follows a hold at once: the same eager rule's held jobs wait for the next event."""
    with pytest.MonkeyPatch.context() as mp:
        decided = _record_decisions(mp)
        res, pol = _run("las+rl", {"wait_below": 1.01, "outlook": 0.0, "budget": 0.0})
    assert res.summary["finished"] == 60 and pol.placer.waits > 0
    held = [(j, t) for j, t, h in decided if h]
    dt = rl_mod.CONSERVE_DT
    assert not [1 for j, t in held for j2, t2, _ in decided if j2 == j and t2 == pytest.approx(t + dt, abs=1e-6)]


def test_a_hold_pays_only_when_its_expected_wait_is_below_what_running_slow_loses() -> None:
    """``payoff``: at 0.8 of full speed a job of 1,000 s of work loses 250 s; k = 2 allows an expected wait (``soon``
    x 4 x 1,000 s) below 500 s, and a placement tenure of a tenth a tenth of that."""
    assert rl_mod.hold_pays(0.1, 1000.0, 0.8, 2.0)  # expects to wait 400 s < 500 s
    assert not rl_mod.hold_pays(0.15, 1000.0, 0.8, 2.0)  # 600 s > 500 s: the wait costs more than it saves
    assert rl_mod.hold_pays(0.01, 1000.0, 0.8, 2.0, tenure=0.1)  # 40 s < 50 s
    assert not rl_mod.hold_pays(0.1, 1000.0, 0.8, 2.0, tenure=0.1)  # 400 s > 50 s
    assert not rl_mod.hold_pays(1.0, 1000.0, 0.1, 100.0)  # no GPUs expected within 4 x: never pays
    assert not rl_mod.hold_pays(0.0, 1000.0, 1.0, 100.0)  # a full-speed slot: nothing to win
    assert rl_mod.hold_pays(0.5, 1000.0, 0.0, 1.0)  # the slot does not run at all


def _record_payoff_gate(mp: pytest.MonkeyPatch) -> tuple[list[bool], list[bool]]:
    """Spy on the payoff gate: the lists it fills as the run goes, every verdict of :func:`hold_pays` and, per hold
    made, the gate's last verdict before it (False when the gate was never asked)."""
    verdicts: list[bool] = []
    holds: list[bool] = []
    real_pays, real_hold = rl_mod.hold_pays, rl_mod.RLPlacement._hold

    def spy_pays(*args: float) -> bool:
        verdicts.append(real_pays(*args))
        return verdicts[-1]

    def spy_hold(self, j: int, p: int = 0) -> None:
        holds.append(verdicts[-1] if verdicts else False)
        real_hold(self, j, p)

    mp.setattr(rl_mod, "hold_pays", spy_pays)
    mp.setattr(rl_mod.RLPlacement, "_hold", spy_hold)
    return verdicts, holds


def test_with_payoff_every_hold_is_one_that_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hold under ``payoff`` comes with the gate's yes (the job's expected wait below k x its slow-slot loss);
    a gate so strict that no hold pays gives exactly consolidate's run."""
    verdicts, holds = _record_payoff_gate(monkeypatch)
    eager = {"wait_below": 1.01, "outlook": 0.0, "budget": 0.0}
    _, free = _run("las+rl", eager)
    assert free.placer.waits > 0 and not verdicts  # off by default: never asked
    holds.clear()
    res, gated = _run("las+rl", {**eager, "payoff": 20.0})
    assert res.summary["finished"] == 60
    assert holds and all(holds) and False in verdicts  # some holds refused, every one made paid
    assert gated.placer.waits == len(holds)
    base, _ = _run("las")
    never, shut = _run("las+rl", {**eager, "payoff": 1e-9})
    assert shut.placer.waits == 0
    assert never.jobs["finish_s"].to_list() == base.jobs["finish_s"].to_list()


def test_the_placement_tenure_is_whole_without_preemption_and_shorter_with_it() -> None:
    """``tenure``: under fifo (no preemption) every placement runs its job to the end (share 1); under las jobs are
    preempted part-way, so the run's mean share is below 1 and above 0."""
    opts = {"wait_below": 1.01, "outlook": 0.0, "payoff": 4.0, "tenure": 1.0}
    _, fifo = _run("fifo+rl", opts)
    assert fifo.placer._tenure.ended >= 20 and fifo.placer.tenure_share() == pytest.approx(1.0)
    res, las = _run("las+rl", opts)
    assert res.summary["finished"] == 60
    assert las.placer._tenure.ended > 60  # preempted placements end too
    assert 0.0 < las.placer.tenure_share() < 1.0


def test_the_orders_that_rank_by_attained_service_say_so_to_their_placement() -> None:
    """las and tiresias (and LAS's spread variant) rank by attained service, fifo, sjf and srtf do not; the policy
    hands itself to its placement as the order it runs under."""
    ranks = {name: make_policy(name).ranks_by_service for name in ("fifo", "sjf", "srtf", "las", "tiresias")}
    assert ranks == {"fifo": False, "sjf": False, "srtf": False, "las": True, "tiresias": True}
    _, policy = _run("srtf+rl", {})
    assert policy.placer.order is policy


@pytest.mark.parametrize("order", ["las", "tiresias"])
def test_without_service_holds_the_guarded_rl_runs_consolidate_under_attained_service(order: str) -> None:
    """``service_holds`` 0 (the default) with ``service_payoff`` 0 (the seventh round's default): under las and
    tiresias no job is held and the run is exactly consolidate's; with ``service_holds`` 1 the same eager rule holds
    jobs there and the run differs."""
    eager = {"wait_below": 1.01, "outlook": 0.0, "budget": 0.0}
    base, _ = _run(order)
    held, rule = _run(f"{order}+rl", {**eager, "service_holds": 1.0})
    assert rule.placer.waits > 0
    assert held.jobs["finish_s"].to_list() != base.jobs["finish_s"].to_list()
    assert float(make_scheduler(f"{order}+rl", {}, {}).placer.opts["service_holds"]) == 0.0  # the default
    res, off = _run(f"{order}+rl", {**eager, "service_holds": 0.0, "service_payoff": 0.0})
    assert off.placer.waits == 0 and off.placer.decisions == 0
    assert res.jobs["finish_s"].to_list() == base.jobs["finish_s"].to_list()
    assert res.summary["avg_jct_s"] == base.summary["avg_jct_s"]


def test_without_service_holds_the_guarded_rl_still_holds_under_srtf() -> None:
    """Under srtf (ranked by remaining work, not attained service) ``service_holds`` changes nothing: the rule
    holds jobs and the run is the same to the second with 0 (the default) and 1, and not consolidate's."""
    eager = {"wait_below": 1.01, "outlook": 0.0, "budget": 0.0}
    base, _ = _run("srtf")
    rule_run, rule = _run("srtf+rl", {**eager, "service_holds": 1.0})
    res, off = _run("srtf+rl", {**eager, "service_holds": 0.0})
    assert off.placer.waits > 0 and off.placer.waits == rule.placer.waits
    assert res.jobs["finish_s"].to_list() == rule_run.jobs["finish_s"].to_list()
    assert res.jobs["finish_s"].to_list() != base.jobs["finish_s"].to_list()


def test_service_payoff_gates_holds_under_attained_service_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``service_payoff`` k (eighth round): under las a job is held only when the payoff gate says the hold pays
    (some are refused), and the run is exactly ``payoff`` k with ``service_holds`` 1 there; under srtf the gate is
    never asked, jobs are held by the ungated rule and the run is the rule's; a gate no hold passes gives las
    consolidate's run."""
    verdicts, holds = _record_payoff_gate(monkeypatch)
    assert float(make_scheduler("las+rl", {}, {}).placer.opts["service_payoff"]) == 2.0  # the default
    eager = {"wait_below": 1.01, "outlook": 0.0, "budget": 0.0, "service_holds": 0.0}
    res, gated = _run("las+rl", {**eager, "service_payoff": 20.0})
    assert res.summary["finished"] == 60
    assert holds and all(holds) and False in verdicts  # some holds refused, every one made paid
    assert gated.placer.waits == len(holds)
    same, _ = _run("las+rl", {**eager, "service_holds": 1.0, "payoff": 20.0})
    assert res.jobs["finish_s"].to_list() == same.jobs["finish_s"].to_list()
    verdicts.clear()
    holds.clear()
    srtf_run, srtf = _run("srtf+rl", {**eager, "service_payoff": 20.0})
    assert srtf.placer.waits > 0 and not verdicts  # held, and never by the gate
    rule_run, _ = _run("srtf+rl", eager)
    assert srtf_run.jobs["finish_s"].to_list() == rule_run.jobs["finish_s"].to_list()
    gated_srtf, _ = _run("srtf+rl", {**eager, "payoff": 20.0})  # the same gate under srtf would change the run
    assert gated_srtf.jobs["finish_s"].to_list() != rule_run.jobs["finish_s"].to_list()
    base, _ = _run("las")
    never, shut = _run("las+rl", {**eager, "service_payoff": 1e-9})
    assert shut.placer.waits == 0
    assert never.jobs["finish_s"].to_list() == base.jobs["finish_s"].to_list()
