"""Turn a pydantic ValidationError into one readable line: file, key path, what is wrong, how to fix it.

pydantic's own messages name a location tuple such as ``('pools', 0, 'gpus_per_node')`` and speak
Python; users edit TOML, so this module writes ``pools[0].gpus_per_node`` and TOML-flavoured advice.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from gpufleet.errors import SpecError


def key_path(loc: Sequence[int | str]) -> str:
    """``('pools', 0, 'gpu')`` -> ``'pools[0].gpu'``; an empty location is the top level."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<top level>"


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        model = _inner_model(arg)
        if model is not None:
            return model
    return None


def model_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model class that validates the table at ``loc`` inside ``root`` (None if not a model)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _inner_model(model.model_fields[part].annotation)
    return model


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(error: dict[str, Any], root: type[BaseModel], prefix: tuple[int | str, ...] = ()) -> str:
    """One problem of a ValidationError as ``key.path: what is wrong; how to fix it``.

    ``prefix`` is where ``root`` sits in the file (e.g. ``('gpus', 3)`` for one catalog entry).
    """
    own_loc = tuple(error["loc"])
    loc = prefix + own_loc
    where = key_path(loc)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    got = error.get("input")
    parent = key_path(loc[:-1])
    if kind == "missing":
        table = "the top level" if not loc[:-1] else parent
        return f"{where}: required key is missing; add `{loc[-1]} = ...` to {table}"
    if kind == "extra_forbidden":
        model = model_at(root, own_loc[:-1])
        valid = list(model.model_fields) if model is not None else []
        hint = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        text = f"{where}: unknown key"
        if hint:
            text += f" (did you mean `{hint[0]}`?)"
        if valid:
            text += f"; valid keys here: {', '.join(valid)}"
        return text
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{where}: expected a whole number, got {_show(got)}; write it as e.g. `{loc[-1]} = 8`"
    if kind in ("float_type", "float_parsing"):
        return f"{where}: expected a number, got {_show(got)}; write it without quotes, e.g. `{loc[-1]} = 2.0`"
    if kind == "string_type":
        return f"{where}: expected a string, got {_show(got)}; put the value in double quotes"
    if kind == "greater_than":
        return f"{where}: must be greater than {ctx.get('gt')}, got {_show(got)}"
    if kind == "greater_than_equal":
        return f"{where}: must be at least {ctx.get('ge')}, got {_show(got)}"
    if kind == "literal_error":
        return f"{where}: must be one of {ctx.get('expected')}, got {_show(got)}"
    if kind == "too_short":
        need = ctx.get("min_length", 1)
        hint = f"; add a [[{loc[-1]}]] table" if isinstance(loc[-1], str) else ""
        entries = "entry" if need == 1 else "entries"
        return f"{where}: needs at least {need} {entries}, got {ctx.get('actual_length', 0)}{hint}"
    if kind == "string_too_short":
        return f"{where}: must not be empty; give it a name"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{where}: expected a table, got {_show(got)}; write it as a [table] or {{ key = value }}"
    if kind in ("list_type", "tuple_type"):
        return f"{where}: expected an array, got {_show(got)}; write `[[{loc[-1]}]]` tables or a [ ... ] list"
    if kind in ("value_error", "assertion_error"):
        return f"{where}: {ctx.get('error', error['msg'])}"
    return f"{where}: {error['msg']} (got {_show(got)})"


def _long_enough(error: dict[str, Any]) -> bool:
    given = error.get("input")
    need = (error.get("ctx") or {}).get("min_length", 0)
    return hasattr(given, "__len__") and len(given) >= need


def spec_error(
    exc: ValidationError, source: str, root: type[BaseModel], prefix: tuple[int | str, ...] = ()
) -> SpecError:
    """A SpecError whose single message lists every problem of ``exc``, prefixed by ``source``.

    ``root`` is the model that was validated and ``prefix`` its key path inside the file.
    """
    errors = exc.errors(include_url=False)
    # pydantic reports a tuple with a bad item as also "too short" (it counts only valid items);
    # that echo would confuse the reader, so drop it when the input itself is long enough.
    errors = [e for e in errors if not (e["type"] == "too_short" and _long_enough(e))] or errors
    problems = [describe(e, root, prefix) for e in errors]
    if len(problems) == 1:
        return SpecError(f"{source}: {problems[0]}")
    listed = "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
    return SpecError(f"{source}: {len(problems)} problems: {listed}")
