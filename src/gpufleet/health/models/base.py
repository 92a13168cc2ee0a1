"""The failure-model interface and its registry: ``--model gbdt`` is a lookup, not an if-chain.

Every model, single or ensemble, follows scikit-learn's estimator shape: ``fit(samples)`` returns the
model, ``score(samples)`` returns one float per instance, higher meaning more likely to fail. Scores are
only compared within one model (top-K alerting), so they need not be calibrated probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.health.samples import Samples
from gpufleet.registry import Registry


@runtime_checkable
class FailureModel(Protocol):
    """A failure predictor: fit on labelled instances, score unlabelled ones."""

    name: str

    def fit(self, samples: Samples) -> FailureModel: ...

    def score(self, samples: Samples) -> np.ndarray: ...


_REGISTRY: Registry[FailureModel] = Registry(
    "failure model", ConfigError, listing="known", empty="none (install gpufleet[health])", set_name=False
)
_HELP: dict[str, str] = {}


def register_model(name: str, help: str = "") -> Callable[[Callable[..., FailureModel]], Callable[..., FailureModel]]:
    """Class decorator: make the model constructible as ``make_model(name, **options)``."""

    def deco(factory: Callable[..., FailureModel]) -> Callable[..., FailureModel]:
        _REGISTRY.register(name)(factory)
        _HELP[name] = help or (factory.__doc__ or "").strip().splitlines()[0]
        return factory

    return deco


def _load_builtin() -> None:
    """Import the modules that register the built-in models (torch ones only when torch is installed)."""
    import importlib

    for module in ("gpufleet.health.models.gbdt", "gpufleet.health.models.torch_nets",
                   "gpufleet.health.models.ensembles"):
        try:
            importlib.import_module(module)
        except ImportError as exc:  # an optional extra is missing: its models are simply not listed
            if exc.name not in ("torch", "lightgbm", "sklearn"):
                raise


def model_names() -> dict[str, str]:
    """Registered model names with a one-line description each."""
    _load_builtin()
    return dict(_HELP)


#: the models built on torch: only they take ``torch_options`` (epochs, max_train, ...)
TORCH_MODELS = frozenset({"mlp", "lstm", "cnn1d"})


def make_model(name: str, *, torch_options: Mapping[str, Any] | None = None, **options: Any) -> FailureModel:
    """A new, unfitted model by registered name; ``torch_options`` go to torch models only, so that one
    set of options can be passed for any model name."""
    _load_builtin()
    if torch_options and name in TORCH_MODELS:
        options = {**torch_options, **options}
    return _REGISTRY.create(name, **options)
