"""The guarded ``rl`` placement trained on arrivals: the arrival features, the old observation as their prefix,
the placement environment's reward and masks, and resumable training."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from helpers import deepshare_arrivals

from gpufleet.sched.candidates import N_SLOTS
from gpufleet.sched.placement.rl import RLPlacement
from gpufleet.sched.policy import make_policy
from gpufleet.sched.rl_features import ARRIVAL_OBS_SIZE, OBS_SIZE, WAIT, arrival_features, observe
from gpufleet.sim.config import SimConfig
from gpufleet.sim.engine import Simulator
from gpufleet.sim.network import network_for
from gpufleet.sim.workload import Workload, partitions_for
from gpufleet.spec.loader import cluster_from_dict

pytest.importorskip("sb3_contrib")
pytest.importorskip("gymnasium")


def _cluster(nodes: int = 4):
    pool = {"name": "train", "kind": "training", "gpu": "v100", "gpus_per_node": 8, "nodes": nodes}
    return cluster_from_dict(
        {"name": "t", "network": {"oversubscription": 1.0}, "pools": [{**pool, "nic": "ib-edr", "nodes_per_rack": 2}]}
    )


def _jobs(rng: np.random.Generator, n: int = 40) -> pl.DataFrame:
    """Jobs of 2 to 16 GPUs with DeepShare models arriving over two hours, so that queues form and jobs spread."""
    return deepshare_arrivals(rng, n, hours=2)


def _build(order: str = "srtf", **opts):
    def build(rng: np.random.Generator, decider):
        spec, jobs = _cluster(), _jobs(rng)
        parts = partitions_for(spec)
        policy = make_policy(order)
        policy.use_placement(
            RLPlacement(
                decider=decider,
                guard=1.0,
                wait_rule=0.0,
                arrivals=1.0,
                **{"small_nodes": 0.0, "service_holds": 1.0, **opts},
            )
        )
        net = network_for(spec, parts, jobs)
        return Simulator(Workload.from_frame(jobs), parts, policy, SimConfig(network=True, debug=True), network=net)

    return build


def test_arrival_features_extend_the_old_observation_and_track_the_wait() -> None:
    """The old observation is the prefix of the new one; a job's wait feature grows while it waits; the decider is
    asked only when there is something to choose (a wait, or more than one node set)."""
    calls: list[tuple[int, np.ndarray, np.ndarray]] = []
    latest: list[list] = []
    asked: list[bool] = []

    def decider(obs: np.ndarray, mask: np.ndarray) -> int:
        sets = {tuple(sorted(latest[-1][i])) for i in np.flatnonzero(mask[:N_SLOTS])}
        asked.append(bool(mask[WAIT]) or len(sets) > 1)
        assert obs.shape == (ARRIVAL_OBS_SIZE,)
        return WAIT

    sim = _build("las", wait_below=1.01, outlook=0.0)(np.random.default_rng(0), decider)
    place = sim.policy.placer
    inner = place.choose

    def spy(j, p, part, cands):
        scores = place.scores(j, p, cands)
        calls.append((j, observe(sim, j, p, part, cands, scores), observe(sim, j, p, part, cands, scores, True)))
        latest.append(cands)
        return inner(j, p, part, cands)

    place.choose = spy
    res = sim.run()
    assert res.summary["finished"] == 40
    assert asked and all(asked) and len(asked) < len(calls)
    assert all(old.shape == (OBS_SIZE,) and new.shape == (ARRIVAL_OBS_SIZE,) for _, old, new in calls)
    assert all(np.array_equal(old, new[:OBS_SIZE]) for _, old, new in calls)
    waits: dict[int, list[float]] = {}
    for j, _, new in calls:
        waits.setdefault(j, []).append(float(new[OBS_SIZE + 1]))
    repeated = [w for w in waits.values() if len(w) > 1]
    # asked again later, it has waited at least as long (a wait never shrinks, running time is not waiting)
    assert repeated and all(np.all(np.diff(w) >= 0) for w in repeated) and any(w[-1] > w[0] for w in repeated)
    assert all(0.0 <= v <= 1.0 for _, _, new in calls for v in new[OBS_SIZE:])


def test_arrival_features_by_hand() -> None:
    from types import SimpleNamespace

    view = SimpleNamespace(
        now=7200.0,
        submit=[0.0, 3600.0, 5400.0, 7200.0, 9000.0],
        held_s=[1800.0, 0.0, 0.0, 0.0, 0.0],
        remaining=[3600.0] * 5,
        duration=[7200.0, 3600.0, 3600.0, 3600.0, 3600.0],
    )
    waited_rel, waited_h, done, recent = arrival_features(view, 0, 2)
    assert waited_rel == pytest.approx(np.log1p(1.5) / 3)  # 5,400 s in the queue over 3,600 s left
    assert waited_h == pytest.approx(np.log1p(1.5) / 3)
    assert done == pytest.approx(0.5)
    assert recent == pytest.approx(np.log1p(3 / 2) / 4)  # arrivals at 3,600, 5,400 and 7,200 s, on 2 nodes


def test_the_alias_and_an_old_model_read_the_old_observation() -> None:
    """A model trained without the arrival features (the shipped t = 0 one) gets the old width, guarded or not."""
    alias = make_policy("rl")
    guarded = RLPlacement(model=str(pytest.importorskip("gpufleet.sched.rl").default_model_path()))
    sim = _build()(np.random.default_rng(1), lambda obs, mask: 0)
    for place in (alias.placer, guarded):
        place.bind(sim)
        assert place._width == OBS_SIZE and not place._arrivals


def test_env_masks_and_its_return_is_minus_the_average_jct() -> None:
    """Rewards add up to minus the average JCT in hours, queueing included."""
    from gpufleet.sched.placement.rl_gym import make_placement_env

    env = make_placement_env(_build("tiresias", wait_below=1.01, outlook=0.0), seed=3)
    obs, info = env.reset(seed=3)
    rng = np.random.default_rng(3)
    # the job-hours before the first decision are no action's doing: reset does not return them as a reward
    total, steps = -env.reward.acc / (3600.0 * env.sim.n), 0
    while True:
        mask = info["action_mask"]
        assert obs.shape == (ARRIVAL_OBS_SIZE,) and np.array_equal(mask, env.action_masks()) and mask.any()
        obs, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        total += r
        steps += 1
        if done:
            break
    jct = env.last_summary["avg_jct_s"] / 3600.0
    assert steps > 5 and total == pytest.approx(-jct, rel=1e-6)
    assert env.last_result.summary == env.last_summary  # the simulator's own result, for callers that want more
    with pytest.raises(RuntimeError, match="reset"):  # the episode is over: a step would wait forever
        env.step(0)
    env.close()


def test_training_writes_checkpoints_and_resumes(tmp_path) -> None:
    from gpufleet.sched.placement.rl_fit import checkpoints, fit_placement
    from gpufleet.sched.placement.rl_gym import make_placement_env

    small = {"n_steps": 64, "batch_size": 32, "n_epochs": 1}
    out = tmp_path / "m.zip"
    first = fit_placement(
        make_placement_env(_build(), seed=0), out, steps=128, checkpoint_every=64, progress=False, settings=small
    )
    assert first["steps"] == 128 and out.is_file()
    assert [n for n, _ in checkpoints(tmp_path / "m.ckpt")] == [64, 128]
    again = fit_placement(
        make_placement_env(_build(), seed=0), out, steps=192, checkpoint_every=64, progress=False, settings=small
    )
    assert again["resumed_from"] == 128 and again["steps"] == 192
    from gpufleet.sched.rl_model import read_actor

    assert read_actor(out).n_obs == ARRIVAL_OBS_SIZE


def test_an_action_bias_starts_the_policy_near_a_rule(tmp_path) -> None:
    """A fresh run with a bias on waiting starts out waiting whenever it may (the rule), then learns from there."""
    from gpufleet.sched.placement.rl_fit import fit_placement
    from gpufleet.sched.placement.rl_gym import make_placement_env
    from gpufleet.sched.rl_model import read_actor

    small = {"n_steps": 64, "batch_size": 64, "n_epochs": 1, "learning_rate": 1e-6}
    probs = {}
    for bias in (0.0, 6.0):
        out = tmp_path / f"b{bias}.zip"
        env = make_placement_env(_build(), seed=0)
        fit_placement(env, out, steps=64, progress=False, settings=small, action_bias={WAIT: bias})
        probs[bias] = read_actor(out).probs(np.zeros(ARRIVAL_OBS_SIZE, dtype=np.float32))[WAIT]
    assert probs[0.0] < 0.5 < 0.9 < probs[6.0]
