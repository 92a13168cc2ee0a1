"""Inference load: how many inference servers the serving side needs over time, for capacity loaning (Aryl).

The model is :class:`~gpufleet.traces.inference.load.InferenceLoad` (``load.py``). The sources that make
one are registered by name, one module each in this package (a new source is one new file):

- ``genai`` (``genai.py``): the shape of the Alibaba GenAI serving trace, scaled to the pool;
- ``diurnal`` (``diurnal.py``): a parametric cosine day with noise;
- ``none`` (``no_load.py``): no inference load, every server always idle;

and a CSV path (``csv_file.py``): any table with ``time`` (seconds) and ``servers_needed``.
:func:`load_inference` picks one (CLI: ``gpufleet traces inference genai``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet.errors import ConfigError, TraceError
from gpufleet.registry import Registry, check_options
from gpufleet.traces.inference.load import DAY_S, InferenceLoad

if TYPE_CHECKING:
    from gpufleet.traces.inference.csv_file import read_load_csv
    from gpufleet.traces.inference.diurnal import diurnal_load
    from gpufleet.traces.inference.genai import GENAI_PROFILE, derive_genai_profile, genai_load, shipped_profile_path

__all__ = [
    "DAY_S",
    "GENAI_PROFILE",
    "InferenceLoad",
    "derive_genai_profile",
    "diurnal_load",
    "genai_load",
    "inference_sources",
    "load_inference",
    "read_load_csv",
    "register_source",
    "shipped_profile_path",
]

F = TypeVar("F", bound=Callable[..., Any])

#: names defined in the source modules, importable from here (lazily: those modules import this one)
_LAZY = {
    "GENAI_PROFILE": "genai",
    "derive_genai_profile": "genai",
    "genai_load": "genai",
    "shipped_profile_path": "genai",
    "diurnal_load": "diurnal",
    "read_load_csv": "csv_file",
    "LOAD_COLUMNS": "csv_file",
}


def __getattr__(name: str) -> Any:
    """Lazy re-export of :data:`_LAZY`."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SOURCES: Registry[InferenceLoad] = Registry(
    "inference load", TraceError, listing="available sources", package="gpufleet.traces.inference"
)


def register_source(name: str, order: int = 50) -> Callable[[F], F]:
    """Decorator: make a source function ``f(pool_servers, *, until_s, **options) -> InferenceLoad`` available
    as ``name``; ``order`` places it in listings (lower first); its docstring's first line is its summary."""

    def decorate(func: F) -> F:
        func.order = order  # type: ignore[attr-defined]
        return SOURCES.register(name)(func)

    return decorate


def inference_sources() -> list[str]:
    """Names ``load_inference`` accepts besides a CSV path, in listing order."""
    return sorted(SOURCES.names(), key=lambda n: (getattr(SOURCES[n], "order", 50), n))


def load_inference(source: str, *, pool_servers: int, until_s: float, **opts: Any) -> InferenceLoad:
    """The inference load named by ``source``: "genai", "diurnal", "none", or the path of a load CSV.

    ``opts`` go to the source's function (e.g. ``headroom=0.3`` for genai, ``peak=0.8`` for diurnal);
    an option it does not take is a ConfigError. A CSV takes no options and keeps its own time span
    (its last count holds forever); its counts must fit ``pool_servers``. A name that is neither a
    source nor an existing file is a TraceError listing the choices.
    """
    key = str(source).strip()
    func = SOURCES.get(key.lower()) if key.lower() in SOURCES else None
    if func is not None:
        check_options(func, opts, f"inference load {key!r}", ConfigError, skip=("pool_servers", "until_s"))
        return func(pool_servers, until_s=until_s, **opts)
    path = Path(key).expanduser()
    if not path.is_file():
        raise TraceError(
            f"unknown inference load {key!r}: not one of {', '.join(inference_sources())} "
            "and not an existing CSV file (columns time,servers_needed)"
        )
    from gpufleet.traces.inference.csv_file import read_load_csv

    check_options(read_load_csv, opts, f"inference load {key!r}", ConfigError, skip=("path", "pool_servers"))
    return read_load_csv(path, pool_servers=pool_servers)
