"""The RL environment over the simulator, PPO training (tiny), checkpoints, determinism and the rl policy."""

from __future__ import annotations

import builtins

import numpy as np
import polars as pl
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")
pytest.importorskip("gymnasium")

from gpufleet.errors import ConfigError
from gpufleet.perf.contention import DEEPSHARE_MODELS, ContentionModel
from gpufleet.sched.rl_features import N_ACTIONS, OBS_SIZE, WAIT
from gpufleet.sim.config import SimConfig
from gpufleet.sim.rl_env import REWARDS, TAIL_WEIGHT, make_env
from gpufleet.sim.rl_train import train_rl
from gpufleet.sim.run import RunSpec, run_one
from gpufleet.spec.loader import cluster_from_dict

MODEL = ContentionModel.default()


def _cluster(nodes: int = 4):
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
                    "nodes_per_rack": 4,
                }
            ],
        }
    )


def _sampler(n: int = 24):
    def draw(rng: np.random.Generator, nodes: int = 4) -> pl.DataFrame:
        models = rng.choice(DEEPSHARE_MODELS, size=n)
        gpus = rng.choice([2, 4, 8], size=n)
        return pl.DataFrame(
            {
                "job_id": [str(i) for i in range(n)],
                "submit_s": np.zeros(n),
                "duration_s": [MODEL.duration_s(m, int(g)) for m, g in zip(models, gpus, strict=True)],
                "num_gpus": gpus,
                "model": models,
            }
        )

    return draw


def _rollout(env, seed: int, actions: int = 200) -> tuple[list[np.ndarray], list[float]]:
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    seen, rewards = [obs], []
    for _ in range(actions):
        mask = info["action_mask"]
        obs, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        seen.append(obs)
        rewards.append(r)
        if done:
            obs, info = env.reset()
    return seen, rewards


def test_env_spaces_masks_and_episode_end() -> None:
    env = make_env(_cluster(), _sampler(), seed=0)
    obs, info = env.reset(seed=0)
    assert obs.shape == (OBS_SIZE,) and env.action_space.n == N_ACTIONS
    assert info["action_mask"].any()
    total, steps, done = 0.0, 0, False
    while not done:
        mask = info["action_mask"]
        action = int(np.flatnonzero(mask[:WAIT])[0])  # always the first feasible placement
        obs, r, done, _, info = env.step(action)
        total += r
        steps += 1
        assert r <= 0.0  # jct reward: minus job-time in the system
    assert steps >= 24  # at least one decision per job
    avg_jct_h = float(env.last_result.jobs["jct_s"].mean()) / 3600.0
    assert total == pytest.approx(-avg_jct_h, rel=1e-6)  # the return is minus the average true JCT in hours
    env.close()


def test_env_is_deterministic_for_a_seed() -> None:
    a, ra = _rollout(make_env(_cluster(), _sampler(), seed=5), 5)
    b, rb = _rollout(make_env(_cluster(), _sampler(), seed=5), 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert ra == rb


def test_the_reward_shapes_the_return_never_the_episode() -> None:
    """Under each reward the same seed and actions give the same observations and episode ends; ``jct-tail`` is
    ``jct`` but for the last step of each episode, which also takes off half its p99 JCT in hours."""
    runs = {}
    for reward in REWARDS:
        env = make_env(_cluster(), _sampler(8), reward=reward, seed=4)
        obs, info = env.reset(seed=4)
        rng = np.random.default_rng(4)
        seen, rewards, tails = [obs], [], []
        for _ in range(120):
            obs, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
            seen.append(obs)
            rewards.append(r)
            if done:
                jct = env.last_result.jobs["jct_s"].to_numpy() / 3600.0
                tails.append(TAIL_WEIGHT * np.percentile(jct, 99))
                assert env.last_summary == env.last_result.summary == info["summary"]
                obs, info = env.reset()
                seen.append(obs)
        env.close()
        runs[reward] = seen, np.array(rewards), tails
    (obs_a, jct, tails), (obs_b, tail, _) = runs["jct"], runs["jct-tail"]
    assert len(tails) >= 2 and all(np.array_equal(a, b) for a, b in zip(obs_a, obs_b, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(obs_a, runs["paper"][0], strict=True))
    ends = np.flatnonzero(jct != tail)
    assert len(ends) == len(tails) and np.allclose(jct[ends] - tail[ends], tails, rtol=1e-9)
    assert np.all(runs["paper"][1] >= -0.5) and np.all(runs["paper"][1] <= 0.5)  # w1 = w2 = 0.5


def test_paper_reward_mixes_slowdown_and_utilisation() -> None:
    env = make_env(_cluster(), _sampler(), reward="paper", w1=0.0, w2=1.0, seed=0)
    _, info = env.reset(seed=0)
    _, r, _, _, _ = env.step(int(np.flatnonzero(info["action_mask"])[0]))
    assert 0.0 <= r <= 1.0  # w2 * utilisation only
    env.close()
    with pytest.raises(ConfigError, match="reward"):
        make_env(_cluster(), _sampler(), reward="nope")


def test_training_is_deterministic_checkpoints_and_resumes(tmp_path) -> None:
    out_a = tmp_path / "a.zip"
    s1 = train_rl(_cluster(), out_a, steps=1024, seed=1, sampler=_sampler(), checkpoint_every=512, progress=False)
    assert out_a.is_file() and s1["steps"] == 1024
    ckpts = sorted(p.name for p in (tmp_path / "a.ckpt").iterdir())
    assert ckpts == ["rl_1024_steps.zip", "rl_512_steps.zip"]
    out_b = tmp_path / "b.zip"
    train_rl(_cluster(), out_b, steps=1024, seed=1, sampler=_sampler(), checkpoint_every=512, progress=False)
    from sb3_contrib import MaskablePPO

    pa = MaskablePPO.load(str(out_a)).policy.state_dict()
    pb = MaskablePPO.load(str(out_b)).policy.state_dict()
    assert all(np.array_equal(pa[k].numpy(), pb[k].numpy()) for k in pa)
    # resume: continues from the newest checkpoint to the new total
    s2 = train_rl(_cluster(), out_a, steps=2048, seed=1, sampler=_sampler(), checkpoint_every=512, progress=False)
    assert s2["resumed_from"] == 1024 and s2["steps"] == 2048  # PPO learns in whole rollouts of 1,024 steps
    # the trained model runs as --policy rl in the simulator
    jobs = _sampler(32)(np.random.default_rng(9))
    res = run_one(RunSpec("rl", jobs, _cluster(8), SimConfig(network=True, debug=True), {"model": str(out_a)}))
    assert res.summary["finished"] == 32


def test_rl_policy_without_the_extra_names_it(monkeypatch) -> None:
    from gpufleet.sched import rl

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.startswith("stable_baselines3"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ConfigError, match=r"gpufleet\[rl\]"):
        rl.require_rl()


def test_missing_model_file_is_a_clear_error(tmp_path) -> None:
    jobs = _sampler(4)(np.random.default_rng(0))
    with pytest.raises(ConfigError, match="not found"):
        run_one(RunSpec("rl", jobs, _cluster(), SimConfig(network=True), {"model": str(tmp_path / "none.zip")}))


def test_jct_tail_reward_adds_the_p99_at_the_end() -> None:
    env = make_env(_cluster(), _sampler(), reward="jct-tail", seed=2)
    _, info = env.reset(seed=2)
    total, done = 0.0, False
    while not done:
        _, r, done, _, info = env.step(int(np.flatnonzero(info["action_mask"][:WAIT])[0]))
        total += r
    jct = env.last_result.jobs["jct_s"].to_numpy() / 3600.0
    assert total == pytest.approx(-jct.mean() - TAIL_WEIGHT * np.percentile(jct, 99), rel=1e-6)
    env.close()


def test_evaluation_refuses_a_run_that_stalls_the_cluster(monkeypatch) -> None:
    """A policy that leaves jobs waiting forever must not score the JCT of only the jobs it finished."""
    from gpufleet.sched.fifo import Fifo
    from gpufleet.sched.policy import POLICIES
    from gpufleet.sim.rl_train import eval_policies

    class HoldsBigJobs(Fifo):
        name = "holds-big-jobs-test"

        def place(self, j, p, part):
            return None if self.sim.gpus[j] >= 8 else super().place(j, p, part)

    with POLICIES.added(HoldsBigJobs.name, HoldsBigJobs):
        assert len(eval_policies(_cluster(), ["srtf"], mix="heavy", seeds=[0], jobs=16)) == 1
        with pytest.raises(ConfigError, match="stalled the cluster"):
            eval_policies(_cluster(), [HoldsBigJobs.name], mix="heavy", seeds=[0], jobs=16)


def test_numpy_actor_gives_the_torch_policy_probabilities() -> None:
    """The shipped policy read as data (no unpickling) returns torch's action probabilities, bit for bit the
    NumPy layers the policy ran before: decisions, and so every figure, are unchanged."""
    import torch
    from sb3_contrib import MaskablePPO

    from gpufleet.sched.rl import default_model_path, load_model

    policy = MaskablePPO.load(str(default_model_path()), device="cpu").policy  # the trusted, shipped file
    fast = load_model(None).probs
    layers = [m for m in [*policy.mlp_extractor.policy_net, policy.action_net] if isinstance(m, torch.nn.Linear)]
    rng = np.random.default_rng(0)
    for scale in (0.1, 1.0, 10.0):
        obs = (rng.standard_normal((20, OBS_SIZE)) * scale).astype(np.float32)
        with torch.no_grad():
            want = policy.get_distribution(torch.as_tensor(obs)).distribution.probs.numpy()
        got = np.stack([fast(o) for o in obs])
        assert got.shape == (20, N_ACTIONS)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        for o, g in zip(obs, got, strict=True):  # the float32 layer-by-layer recipe, exactly
            x = o
            for i, layer in enumerate(layers):
                x = x @ layer.weight.detach().numpy().T.copy() + layer.bias.detach().numpy()
                x = np.tanh(x) if i < len(layers) - 1 else x
            x = x.astype(np.float64)
            e = np.exp(x - x.max())
            assert np.array_equal(g, e / e.sum())


def test_rl_model_refuses_a_network_it_cannot_read(tmp_path) -> None:
    """A zip whose actor is not a plain MLP is a one-line ConfigError, never a silent other network."""
    import io
    import zipfile

    import torch

    from gpufleet.sched.rl import default_model_path
    from gpufleet.sched.rl_model import read_actor

    with zipfile.ZipFile(default_model_path()) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    state = torch.load(io.BytesIO(members["policy.pth"]), weights_only=True)
    state["mlp_extractor.policy_net.4.weight"] = torch.ones(64)  # a LayerNorm after the last Tanh
    state["mlp_extractor.policy_net.4.bias"] = torch.zeros(64)
    buf = io.BytesIO()
    torch.save(state, buf)
    bad = tmp_path / "layernorm.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        for name, data in {**members, "policy.pth": buf.getvalue()}.items():
            zf.writestr(name, data)
    with pytest.raises(ConfigError, match=r"layernorm\.zip.*not a Linear layer"):
        read_actor(bad)
    text = tmp_path / "notes.zip"
    text.write_text("not a zip\n")
    with pytest.raises(ConfigError, match=r"notes\.zip: not a stable-baselines3 model zip"):
        read_actor(text)
