"""The failure-model interface and its registry: ``--model gbdt`` is a lookup, not an if-chain.

Every model, single or ensemble, follows scikit-learn's estimator shape: ``fit(samples)`` returns the
model, ``score(samples)`` returns one float per instance, higher meaning more likely to fail. Scores are
only compared within one model (top-K alerting), so they need not be calibrated probabilities.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gpufleet.errors import ConfigError
from gpufleet.health.samples import Samples
from gpufleet.registry import Registry

#: the package whose modules register the built-in models; model files name a module of it, never another
PACKAGE = "gpufleet.health.models"
_MODULE = re.compile(rf"{re.escape(PACKAGE)}(\.[A-Za-z_][A-Za-z0-9_]*)+")


@runtime_checkable
class FailureModel(Protocol):
    """A failure predictor: fit on labelled instances, score unlabelled ones."""

    name: str

    def fit(self, samples: Samples) -> FailureModel: ...

    def score(self, samples: Samples) -> np.ndarray: ...


_REGISTRY: Registry[FailureModel] = Registry(
    "failure model",
    ConfigError,
    listing="known",
    empty="none (install gpufleet[health])",
    set_name=False,
    package=PACKAGE,  # every module here is imported; torch ones only when torch is installed
    optional=("torch", "lightgbm", "sklearn"),
)
#: the failure-model registry, under its public name
MODELS = _REGISTRY


def register_model(name: str, help: str = "") -> Callable[[Callable[..., FailureModel]], Callable[..., FailureModel]]:
    """Class decorator: make the model constructible as ``make_model(name, **options)``; ``help`` is its
    one-line summary (default: the first line of its docstring)."""
    return _REGISTRY.register(name, help or None)


def _load_builtin() -> None:
    """Import the modules that register the built-in models (the registry discovers them once)."""
    _REGISTRY.discover()


def model_names() -> dict[str, str]:
    """Registered model names with a one-line description each."""
    return _REGISTRY.summaries()


def make_model(name: str, *, torch_options: Mapping[str, Any] | None = None, **options: Any) -> FailureModel:
    """A new, unfitted model by registered name; ``torch_options`` (epochs, max_train, ...) go only to models
    that declare ``takes_torch_options``, so that one set of options can be passed for any model name."""
    if torch_options and getattr(_REGISTRY.get(name), "takes_torch_options", False):  # the torch models
        options = {**torch_options, **options}
    return _REGISTRY.create(name, **options)


def model_factory(name: str) -> Callable[..., FailureModel]:
    """The factory (usually the class) registered as ``name``: model files name their classes this way."""
    _load_builtin()
    return _REGISTRY.get(name)


def registered_name(cls: type) -> str | None:
    """The name ``cls`` is registered under, None when it is no registered model (no module is imported)."""
    name = getattr(cls, "name", None)
    return name if isinstance(name, str) and _REGISTRY.registered(name) is cls else None


def registered_model(name: str, module: str) -> Callable[..., FailureModel]:
    """The model class registered as ``name`` by ``module``, importing that module only (so that reading a
    LightGBM model does not import torch); ConfigError unless ``module`` is one of :data:`PACKAGE`'s and the
    class registered under ``name`` is defined there."""
    if not _MODULE.fullmatch(module):
        raise ConfigError(f"'{module}' is not a module of {PACKAGE}")
    try:
        importlib.import_module(module)
    except ImportError as exc:
        top = (exc.name or "").split(".")[0]
        if top in _REGISTRY.optional:
            raise ConfigError(f"the '{name}' model needs {top}, which is not installed") from None
        raise ConfigError(f"cannot import {module} ({type(exc).__name__}: {exc})") from None
    factory = _REGISTRY.registered(name)
    if factory is None or getattr(factory, "__module__", None) != module:
        raise ConfigError(f"{module} registers no failure model '{name}'")
    return factory
