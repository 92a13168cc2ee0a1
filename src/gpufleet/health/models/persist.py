"""Fitted failure models as files that hold only data: JSON, safetensors arrays and LightGBM's model text.

A model file is a zip archive (read with :mod:`zipfile`, never unpickled) of:

- ``gpufleet-model.json``: ``{"format": ..., "content": tree}``, the tree being the saved object in JSON: numbers,
  strings, lists and objects as themselves, anything else tagged (``{"$tuple": [...]}``, ``{"$array": key}``,
  ``{"$model": name, "state": {...}}``, ...);
- ``arrays.safetensors``: every NumPy array of the tree (scaler statistics, network weights, calibration knots);
- ``lightgbm/<n>.txt``: each LightGBM booster in LightGBM's own text format.

A model's state is what ``__getstate__`` returns, as for pickle, so a new model made of plain data (numbers,
strings, arrays, lists, dicts, other models) saves with no extra code. Loading builds objects only of classes
the failure-model registry names (importing only the model module the file names, which must be one of
``gpufleet.health.models``), or the few value classes marked with :func:`plain_state`, without calling their
constructors: nothing in a file names a function to run. A state must hold every attribute an instance of its
class has, and no attribute may hide a method. Every member is read with a size limit (no zip bomb expands).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from gpufleet.errors import GpufleetError, HealthError
from gpufleet.health.models.base import PACKAGE
from gpufleet.safeload import MiB, read_info, why_unreadable

MANIFEST = "gpufleet-model.json"
ARRAYS = "arrays.safetensors"
_PICKLE_MAGIC = b"\x80"  # pickle protocols 2 and later start with the PROTO opcode
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same model writes the same bytes
_KINDS = "biuf"  # array dtypes a file may hold: bool, signed and unsigned integers, floats
_PLAIN: dict[str, type] = {}
# what a model file may expand to; real models are far smaller (the tests measure them: tens of KiB to MiBs)
_MANIFEST_LIMIT = 64 * MiB
_ARRAYS_LIMIT = 512 * MiB
_TEXT_LIMIT = 256 * MiB  # each LightGBM booster's text
_MAX_TEXTS = 64  # LightGBM boosters in one file
_TOTAL_LIMIT = 1024 * MiB

C = TypeVar("C", bound=type)


class ModelFileError(HealthError):
    """A model file that cannot be read as one (not our archive, a pickle, a malformed tree)."""


def plain_state(cls: C) -> C:
    """Class decorator: let model files hold instances of this value class (rebuilt from its plain state)."""
    _PLAIN[cls.__qualname__] = cls
    return cls


# ------------------------------------------------------------------------------------------------ encode


class _Encoder:
    """Turns an object tree into tagged JSON, collecting arrays and LightGBM texts on the side."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.texts: dict[str, str] = {}

    def value(self, v: Any, where: str) -> Any:
        if v is None or isinstance(v, bool | int | str):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"$float": repr(v)}
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in _KINDS:
                raise ModelFileError(f"cannot save {where}: arrays of dtype {v.dtype} are not supported")
            key = f"a{len(self.arrays)}"
            self.arrays[key] = np.ascontiguousarray(v)
            return {"$array": key}
        if isinstance(v, np.generic):
            if v.dtype.kind not in _KINDS:
                raise ModelFileError(f"cannot save {where}: NumPy scalars of dtype {v.dtype} are not supported")
            return {"$scalar": [v.dtype.str, self.value(v.item(), where)]}
        if isinstance(v, tuple):
            return {"$tuple": [self.value(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, list):
            return [self.value(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, dict):
            if all(isinstance(k, str) for k in v):
                body = {k: self.value(x, f"{where}.{k}") for k, x in v.items()}
                return {"$dict": body} if any(k.startswith("$") for k in v) else body
            return {"$items": [[self.value(k, where), self.value(x, f"{where}[{k!r}]")] for k, x in v.items()]}
        if _is_booster(v):
            key = f"lightgbm/{len(self.texts)}.txt"
            self.texts[key] = v.model_to_string(num_iteration=-1)
            return {"$lightgbm": key, "best_iteration": int(v.best_iteration)}
        name = _model_name(v)
        if name is not None:
            module = type(v).__module__
            if module.startswith(f"{PACKAGE}."):  # read back by importing that module only
                return {"$model": name, "module": module, "state": self.state(v, where)}
            return {"$model": name, "state": self.state(v, where)}
        if _PLAIN.get(type(v).__qualname__) is type(v):
            return {"$object": type(v).__qualname__, "state": self.state(v, where)}
        raise ModelFileError(
            f"cannot save {where}: a {type(v).__name__} is not plain data (numbers, strings, "
            "arrays, lists, dicts, registered models); give its class a __getstate__ that "
            "returns plain data"
        )

    def state(self, obj: Any, where: str) -> Any:
        state = obj.__getstate__()
        if state is None:
            state = {}
        if not isinstance(state, dict):
            raise ModelFileError(f"cannot save {where}: {type(obj).__name__}.__getstate__ must return a dict")
        return self.value(state, where)


def _is_booster(v: Any) -> bool:
    cls = type(v)
    return cls.__name__ == "Booster" and cls.__module__.split(".")[0] == "lightgbm"


def _model_name(v: Any) -> str | None:
    """The registered name of ``v``'s class, when ``v`` is a registered failure model."""
    from gpufleet.health.models.base import registered_name

    return registered_name(type(v))


# ------------------------------------------------------------------------------------------------ decode


class _Decoder:
    """Rebuilds the object tree from tagged JSON, the arrays and the LightGBM texts."""

    def __init__(self, arrays: dict[str, np.ndarray], texts: dict[str, str]) -> None:
        self.arrays = arrays
        self.texts = texts

    def value(self, t: Any) -> Any:
        if t is None or isinstance(t, bool | int | float | str):
            return t
        if isinstance(t, list):
            return [self.value(x) for x in t]
        if not isinstance(t, dict):
            raise ModelFileError(f"unexpected {type(t).__name__} in the model tree")
        tag = next(iter(t), "")
        if not tag.startswith("$"):  # a plain dict of string keys
            return {k: self.value(x) for k, x in t.items()}
        body = t[tag]
        if tag == "$dict" and isinstance(body, dict):
            return {k: self.value(x) for k, x in body.items()}
        if tag == "$items" and isinstance(body, list):
            return {self.value(k): self.value(x) for k, x in body}
        if tag == "$tuple" and isinstance(body, list):
            return tuple(self.value(x) for x in body)
        if tag == "$float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "$array" and body in self.arrays:
            return np.array(self.arrays[body], copy=True)  # writable, as the fitted model had it
        if tag == "$scalar" and isinstance(body, list) and len(body) == 2:
            dtype = np.dtype(str(body[0]))
            if dtype.kind not in _KINDS:
                raise ModelFileError(f"NumPy scalar of dtype {dtype} in the model tree")
            return dtype.type(self.value(body[1]))
        if tag == "$lightgbm" and body in self.texts:
            import lightgbm as lgb

            booster = lgb.Booster(model_str=self.texts[body])
            booster.best_iteration = int(t.get("best_iteration", 0))
            return booster
        if tag == "$model" and isinstance(body, str):
            return self.build(_model_class(body, t.get("module")), t.get("state"))
        if tag == "$object" and body in _PLAIN:
            return self.build(_PLAIN[body], t.get("state"))
        raise ModelFileError(f"unknown or malformed entry {tag!r} in the model tree")

    def build(self, cls: type, state: Any) -> Any:
        """An instance of ``cls`` with ``state``, its constructor not called (as pickle restores objects)."""
        values = self.value(state)
        if not isinstance(values, dict):
            raise ModelFileError(f"the state of a {cls.__name__} is not a dict")
        _check_state(cls, values)
        obj = cls.__new__(cls)
        setstate: Callable[[dict], None] | None = getattr(obj, "__setstate__", None)
        if setstate is not None:
            setstate(values)
        else:
            obj.__dict__.update(values)
        return obj


def _check_state(cls: type, state: dict) -> None:
    """ModelFileError unless ``state`` holds every attribute of a ``cls`` and none that hides a method."""
    missing = _state_keys(cls) - state.keys()
    if missing:
        raise ModelFileError(f"its {cls.__name__} lacks {', '.join(sorted(missing))}")
    for key in state:
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("__"):
            raise ModelFileError(f"its {cls.__name__} has an attribute named {key!r}")
        attr = inspect.getattr_static(cls, key, None)
        if callable(attr) or hasattr(type(attr), "__get__"):  # a method, property or other descriptor
            raise ModelFileError(f"its {cls.__name__} has an attribute {key!r} that hides the class's own")


@functools.cache
def _state_keys(cls: type) -> frozenset[str]:
    """The attributes every instance of ``cls`` has: a dataclass's fields, else the state of an instance made
    with the default options (models set their fitted attributes, to None, in ``__init__``, as make_model does)."""
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls))
    try:
        state = cls().__getstate__()
    except Exception:  # a class that needs options: only the checks of its own methods apply
        return frozenset()
    return frozenset(state) if isinstance(state, dict) else frozenset()


def _model_class(name: str, module: Any) -> type:
    from gpufleet.health.models.base import model_factory, registered_model

    try:
        # files name the defining module (only one of gpufleet.health.models is imported); files of models
        # registered from elsewhere (a test's stand-in) do not, and the registry's full discovery finds them
        cls = model_factory(name) if module is None else registered_model(name, str(module))
    except GpufleetError as exc:  # an unknown name, e.g. a torch model without torch installed
        raise ModelFileError(f"it holds a '{name}' model, which this installation cannot build ({exc})") from None
    if not isinstance(cls, type):
        raise ModelFileError(f"the '{name}' model is not a class and cannot be loaded from a file")
    return cls


# ------------------------------------------------------------------------------------------------ files


def save_file(path: str | Path, fmt: str, content: Any) -> Path:
    """Write ``content`` (an object tree holding models, arrays and plain values) as a model archive."""
    from safetensors.numpy import save as save_arrays

    enc = _Encoder()
    tree = enc.value(content, "model")
    manifest = json.dumps({"format": fmt, "content": tree}, indent=1, allow_nan=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    members = {MANIFEST: manifest.encode(), ARRAYS: save_arrays(enc.arrays) if enc.arrays else b""}
    members.update({name: text.encode() for name, text in enc.texts.items()})
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items():
                zf.writestr(zipfile.ZipInfo(name, date_time=_ZIP_TIME), data, compress_type=zipfile.ZIP_DEFLATED)
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no half-written file is left behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_file(path: str | Path, what: str, check_format: Callable[[str], None]) -> Any:
    """The object tree of the model archive at ``path``; ModelFileError naming the file otherwise.

    A pickle, or any file that is not our archive, is refused before anything in it is interpreted.
    ``check_format`` sees the manifest's format first and raises when this gpufleet cannot read it.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:1] == _PICKLE_MAGIC:
        raise ModelFileError(
            f"{path}: a pickle, not a {what} (older gpufleets wrote pickles); pickles are never "
            "read, as opening one can run any code in it: retrain with `gpufleet health train`"
        )
    if not zipfile.is_zipfile(path):
        raise ModelFileError(f"{path}: not a {what}; write one with `gpufleet health train`")
    try:
        with zipfile.ZipFile(path) as zf:
            read = _BoundedReader(zf)
            manifest = json.loads(read(MANIFEST, _MANIFEST_LIMIT))
            if not isinstance(manifest, dict) or not isinstance(manifest.get("format"), str):
                raise ModelFileError(f"its {MANIFEST} names no format")
            check_format(manifest["format"])
            raw = read(ARRAYS, _ARRAYS_LIMIT)
            names = sorted({name for name in zf.namelist() if name.startswith("lightgbm/")})
            if len(names) > _MAX_TEXTS:
                raise ModelFileError(f"it holds {len(names)} LightGBM models, more than the {_MAX_TEXTS} read")
            texts = {name: read(name, _TEXT_LIMIT).decode() for name in names}
        from safetensors.numpy import load as load_arrays

        arrays = load_arrays(raw) if raw else {}
        return _Decoder(arrays, texts).value(manifest.get("content"))
    except ModelFileError as exc:  # raised above without the path
        raise ModelFileError(f"{path}: not a valid {what} ({exc}); write one with `gpufleet health train`") from None
    except HealthError:  # check_format's own message
        raise
    except Exception as exc:  # a damaged or oversized member: zip, zlib, JSON, safetensors or LightGBM errors
        raise ModelFileError(
            f"{path}: not a valid {what} ({why_unreadable(exc)}); write one with `gpufleet health train`"
        ) from None


class _BoundedReader:
    """Reads members of one archive, each within its own limit and all within :data:`_TOTAL_LIMIT`."""

    def __init__(self, zf: zipfile.ZipFile) -> None:
        self.zf = zf
        self.left = _TOTAL_LIMIT

    def __call__(self, name: str, limit: int) -> bytes:
        info = self.zf.getinfo(name)
        if info.file_size > self.left:
            raise ModelFileError(f"its members expand to more than {_TOTAL_LIMIT // MiB} MiB in all")
        data = read_info(self.zf, info, min(limit, self.left))
        self.left -= len(data)
        return data
