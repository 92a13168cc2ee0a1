"""``rl``: placement learned with masked PPO (sb3-contrib), with the heuristic as fallback (the paper's RL-hybrid).

For each job the order offers, the policy sees :func:`gpufleet.sched.rl_features.observe` and picks a
candidate node set, waits, or hands the decision to the heuristic. A choice that does not fit now, or a
wait while nothing runs (nothing would ever wake the job), falls back to the ``contention`` heuristic's
choice. With no ``model`` option it loads the small model that ships in the wheel
(``gpufleet/data/rl/contention_ppo.zip``, trained by the command in docs/contention.md). torch,
stable-baselines3 and gymnasium come with the ``rl`` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.sched.base import register
from gpufleet.sched.netaware import CandidatePolicy, least_cost
from gpufleet.sched.rl_features import HEURISTIC, WAIT, action_mask, observe

#: The model that ships in the wheel.
DEFAULT_MODEL = "contention_ppo.zip"
_MODELS: dict[str, Any] = {}

#: A decider maps (observation, feasible-action mask) to an action; the training environment supplies one.
Decider = Callable[[np.ndarray, np.ndarray], int]


def require_rl() -> None:
    """Raise a ConfigError naming the extra when torch / stable-baselines3 / gymnasium are missing."""
    missing = []
    for mod in ("torch", "stable_baselines3", "sb3_contrib", "gymnasium"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ConfigError(f"the rl policy needs {', '.join(missing)}: pip install 'gpufleet[rl]'")


def default_model_path() -> Path:
    """Where the shipped model lives."""
    return Path(str(resources.files("gpufleet.data").joinpath("rl").joinpath(DEFAULT_MODEL)))


def load_model(path: str | Path | None) -> Any:
    """A PPO model from ``path`` (default: the shipped one), cached per path."""
    require_rl()
    target = Path(path) if path else default_model_path()
    key = str(target.resolve())
    if key not in _MODELS:
        if not target.is_file():
            hint = " (the shipped model is missing: train one with `gpufleet sched train-rl`)" if not path else ""
            raise ConfigError(f"RL model {target} not found{hint}")
        import torch
        from sb3_contrib import MaskablePPO

        torch.set_num_threads(1)
        try:
            _MODELS[key] = MaskablePPO.load(str(target), device="cpu")
        except Exception as exc:  # a corrupt or foreign zip
            raise ConfigError(f"cannot load RL model {target}: {exc}") from exc
    return _MODELS[key]


def numpy_actor(policy: Any) -> Callable[[np.ndarray], np.ndarray] | None:
    """The policy's action probabilities for one observation as plain NumPy (the layers in float32 as torch runs
    them, the softmax in float64), or None when the observation is not a flat Box or the network is not a
    Linear/Tanh/ReLU stack. One decision then costs microseconds instead of the
    ~60 us of torch modules and two Categorical distributions, which dominated a Philly run with ``rl``."""
    from gymnasium import spaces
    from stable_baselines3.common.torch_layers import FlattenExtractor
    from torch import nn

    space = policy.observation_space
    if not isinstance(policy.features_extractor, FlattenExtractor) or not isinstance(space, spaces.Box) \
            or len(space.shape) != 1:
        return None  # SB3 would preprocess such observations (one-hot, images): keep its own path
    layers: list[tuple[str, Any, Any]] = []
    for module in [*policy.mlp_extractor.policy_net, policy.action_net]:
        if isinstance(module, nn.Linear):
            weight = module.weight.detach().float().numpy().T.copy()
            bias = module.bias.detach().float().numpy().copy() if module.bias is not None else None
            layers.append(("linear", weight, bias))
        elif isinstance(module, nn.Tanh | nn.ReLU):
            layers.append(("tanh" if isinstance(module, nn.Tanh) else "relu", None, None))
        else:
            return None

    def probs(obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float32)
        for kind, weight, bias in layers:
            if kind == "linear":
                x = x @ weight
                if bias is not None:
                    x = x + bias
            elif kind == "tanh":
                x = np.tanh(x)
            else:
                x = np.maximum(x, 0.0)
        x = x.astype(np.float64)
        e = np.exp(x - x.max())
        return e / e.sum()

    return probs


@register
class LearnedPlacement(CandidatePolicy):
    """Candidate placement chosen by a PPO policy; infeasible choices fall back to the heuristic."""

    name = "rl"
    summary = "network-aware placement learned with PPO (gpufleet sched train-rl); heuristic fallback"
    #: ``order`` srsf (GPUs x remaining time): the order the shipped model was trained and selected in
    #: (docs/contention.md); a model trained in another order should be run with that order.
    #: ``sample`` > 0: draw actions from the policy with that seed (deterministic for the seed); 0: take the
    #: most likely action, which waits more (upstream's RL also samples by default: its argmax can livelock)
    options: ClassVar[dict[str, float | str]] = {"order": "srsf", "model": "", "sample": 1.0}

    def __init__(self, decider: Decider | None = None, **opts: Any) -> None:
        super().__init__(**opts)
        self.decider = decider
        self.decisions = 0
        self.fallbacks = 0
        self.delegated = 0
        self.waits = 0
        self._policy: Any = None
        self._fast: Callable[[np.ndarray], np.ndarray] | None = None

    def bind(self, sim: Any) -> None:
        super().bind(sim)
        seed = int(float(self.opts["sample"]))
        self._rng = np.random.default_rng(seed) if seed > 0 else None
        if self.decider is None and self._policy is None:
            self._policy = load_model(str(self.opts["model"]) or None).policy
            self._fast = numpy_actor(self._policy)  # copied once, not at every run the policy is bound to

    def _act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        if self.decider is not None:
            return int(self.decider(obs, mask))
        if self._fast is not None:
            return self._pick(self._fast(obs) * mask)
        import torch

        with torch.no_grad():
            t = torch.as_tensor(obs[None, :])
            probs = self._policy.get_distribution(t).distribution.probs[0].numpy().astype(np.float64)
        return self._pick(probs * mask)  # trained with the same mask (MaskablePPO): infeasible actions mean nothing

    def _pick(self, probs: np.ndarray) -> int:
        """The most likely feasible action, or one drawn in proportion (``sample``); the heuristic if none."""
        if probs.sum() <= 0.0:
            return HEURISTIC
        if self._rng is None:
            return int(probs.argmax())
        return int(self._rng.choice(len(probs), p=probs / probs.sum()))

    def choose(self, j: int, p: int, part: Any, cands: list) -> int | None:
        sim = self.sim
        scores = self.scores(j, p, cands)
        obs = observe(sim, j, p, part, cands, scores)
        mask = action_mask(cands, can_wait=sim.n_running > 0)  # type: ignore[union-attr]
        action = self._act(obs, mask)
        self.decisions += 1
        if action == WAIT and mask[WAIT]:
            self.waits += 1
            return None
        if action < WAIT and mask[action]:
            return action
        if action == HEURISTIC:
            self.delegated += 1
        else:
            self.fallbacks += 1
        return least_cost(scores, sim.gpus[j])[0]  # type: ignore[union-attr]
