"""A trained placement policy read from a stable-baselines3 zip as data: the actor's weights, never a pickle.

stable-baselines3's own ``load`` rebuilds spaces, schedules and classes with cloudpickle, so opening a model
file from elsewhere that way can run any code the file holds. The ``rl`` policy needs only the actor network,
a stack of Linear layers with Tanh or ReLU between them. It comes from ``policy.pth``, a state dict read with
``torch.load(weights_only=True)``, and from the plain-JSON parts of the zip's ``data`` (the observation shape,
the activation). Anything else in the zip is ignored, and each member is read within a size limit (a zip bomb
is refused before it expands).
"""

from __future__ import annotations

import io
import itertools
import json
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.safeload import MiB, load_torch_weights, read_member, why_unreadable

_ACTIVATIONS = {"Tanh": "tanh", "ReLU": "relu"}
#: policy_kwargs that do not change the actor's forward pass (net_arch is read from the weights themselves)
_HARMLESS_KWARGS = {"net_arch", "activation_fn", "ortho_init"}
_HIDDEN = re.compile(r"^mlp_extractor\.policy_net\.(\d+)\.(weight|bias)$")
# what the members read may expand to; the shipped model's are 15 KB (data) and 72 KB (policy.pth)
_DATA_LIMIT = 16 * MiB
_WEIGHTS_LIMIT = 512 * MiB


@dataclass(frozen=True)
class ActorMLP:
    """The actor of a masked-PPO policy as NumPy: action probabilities of one flat observation.

    The layers run in float32 as torch runs them, the softmax in float64, so that decisions equal those of the
    torch policy (one decision costs microseconds instead of the ~60 us of torch modules).
    """

    weights: tuple[np.ndarray, ...]  # (in, out) float32, hidden layers then the action layer
    biases: tuple[np.ndarray | None, ...]
    activation: str  # "tanh" or "relu", after every hidden layer

    @property
    def n_obs(self) -> int:
        return int(self.weights[0].shape[0])

    @property
    def n_actions(self) -> int:
        return int(self.weights[-1].shape[1])

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """Action probabilities (float64) for one observation."""
        x = np.asarray(obs, dtype=np.float32)
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = x @ weight
            if bias is not None:
                x = x + bias
            if i < last:
                x = np.tanh(x) if self.activation == "tanh" else np.maximum(x, 0.0)
        x = x.astype(np.float64)
        e = np.exp(x - x.max())
        return e / e.sum()


def read_actor(path: str | Path) -> ActorMLP:
    """The actor of the stable-baselines3 (sb3-contrib MaskablePPO) model zip at ``path``; ConfigError otherwise."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            data = json.loads(read_member(zf, "data", _DATA_LIMIT))
            raw = read_member(zf, "policy.pth", _WEIGHTS_LIMIT)
    # a missing member, a damaged or oversized one (zlib.error, EOFError), an encrypted one (RuntimeError)
    except (KeyError, OSError, ValueError, EOFError, RuntimeError, zipfile.BadZipFile, zlib.error) as exc:
        raise ConfigError(
            f"cannot load RL model {path}: not a stable-baselines3 model zip ({why_unreadable(exc)}); "
            "train one with `gpufleet sched train-rl`"
        ) from None
    try:
        return _actor(data, _load_state_dict(raw))
    except ConfigError as exc:
        raise ConfigError(f"cannot load RL model {path}: {exc}") from None


def _load_state_dict(raw: bytes) -> dict[str, Any]:
    _check_stored(raw)
    try:
        state = load_torch_weights(io.BytesIO(raw))
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ... for what is not plain weights
        raise ConfigError(f"its policy.pth is not a plain state dict ({why_unreadable(exc)})") from None
    if not isinstance(state, dict):
        raise ConfigError("its policy.pth is not a state dict")
    return state


def _check_stored(raw: bytes) -> None:
    """ConfigError unless the torch archive ``raw`` holds its tensors uncompressed, as ``torch.save`` writes them
    (a compressed member could expand far past the file's size when torch reads it)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a zip: torch's legacy format, or not weights at all (torch.load says which)
    total = sum(info.file_size for info in infos)
    if any(info.compress_type != zipfile.ZIP_STORED for info in infos) or total > len(raw):
        raise ConfigError("its policy.pth has compressed members; torch.save writes them uncompressed")


def _actor(data: Any, state: dict[str, Any]) -> ActorMLP:
    """Check the zip describes a flat-observation MLP policy and take its actor's layers from ``state``."""
    import torch

    if not isinstance(data, dict):
        raise ConfigError("its data is not a JSON object")
    activation = _activation(data.get("policy_kwargs") or {})
    shape = _readable(data.get("observation_space"), "_shape", "gymnasium.spaces.box.Box")
    if not isinstance(shape, list) or len(shape) != 1:
        raise ConfigError("gpufleet reads policies over a flat Box observation only")
    if any(k.startswith(("features_extractor.", "pi_features_extractor.")) for k in state):
        raise ConfigError("its features extractor has weights; gpufleet reads plain MLP policies only")
    hidden = sorted({int(m.group(1)) for k in state if (m := _HIDDEN.match(k))})
    if hidden != list(range(0, 2 * len(hidden), 2)):  # Linear, activation, Linear, activation, ...
        raise ConfigError("its policy network is not a stack of Linear layers with activations between them")
    names = [f"mlp_extractor.policy_net.{i}" for i in hidden] + ["action_net"]
    weights, biases = [], []
    for name in names:
        w, b = state.get(f"{name}.weight"), state.get(f"{name}.bias")
        if not isinstance(w, torch.Tensor) or not (b is None or isinstance(b, torch.Tensor)):
            raise ConfigError(f"its policy lacks the weights of {name}")
        if w.dim() != 2 or (b is not None and tuple(b.shape) != (w.shape[0],)):
            raise ConfigError(f"its policy layer {name} is not a Linear layer; gpufleet reads plain MLP policies only")
        weights.append(w.detach().float().numpy().T.copy())
        biases.append(b.detach().float().numpy().copy() if b is not None else None)
    for a, b in itertools.pairwise(weights):
        if a.shape[1] != b.shape[0]:
            raise ConfigError("its policy layers do not chain (an output width differs from the next input)")
    actor = ActorMLP(tuple(weights), tuple(biases), activation)
    if actor.n_obs != int(shape[0]):
        raise ConfigError(f"its network reads {actor.n_obs} values but the observation has {shape[0]}")
    return actor


def _activation(kwargs: Any) -> str:
    """The activation between hidden layers: SB3's default Tanh unless policy_kwargs names ReLU."""
    if not isinstance(kwargs, dict):
        raise ConfigError("its policy_kwargs are not a JSON object")
    serialized = ":serialized:" in kwargs  # SB3 keeps str() of each entry beside the pickle, which is not read
    unknown = set(kwargs) - _HARMLESS_KWARGS - ({":type:", ":serialized:"} if serialized else set())
    if unknown:
        raise ConfigError(f"gpufleet reads MLP policies only; its policy_kwargs set {', '.join(sorted(unknown))}")
    fn = kwargs.get("activation_fn")
    if fn is None:
        return "tanh"
    found = re.fullmatch(r"<class 'torch\.nn\.modules\.activation\.(\w+)'>", str(fn))
    if not found or found.group(1) not in _ACTIVATIONS:
        raise ConfigError(f"its activation {fn} is not one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[found.group(1)]


def _readable(entry: Any, key: str, type_name: str) -> Any:
    """The JSON value of ``key`` that SB3 writes in plain text beside a pickled object of type ``type_name``."""
    if not isinstance(entry, dict) or type_name not in str(entry.get(":type:", "")):
        raise ConfigError(f"gpufleet reads policies whose observation space is a {type_name.rsplit('.', 1)[-1]}")
    try:
        return json.loads(str(entry.get(key)))
    except ValueError:
        raise ConfigError(f"its observation space has no readable {key}") from None
