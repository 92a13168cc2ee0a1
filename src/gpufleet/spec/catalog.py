"""The GPU and NIC catalogs shipped in ``gpufleet/data`` and name lookups into them.

Catalogs are read once, on first use (not at import), and cached. Lookups are case-insensitive and
accept aliases ("A100_80G", "NVIDIA A100-SXM4-80GB", "HDR"); unknown names raise SpecError with the
closest match and the list of valid names.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from gpufleet.errors import SpecError
from gpufleet.spec._names import compact, unknown_name_message
from gpufleet.spec._toml import parse_toml, read_toml
from gpufleet.spec._validation import spec_error
from gpufleet.spec.hardware import GPUSpec, NICSpec

__all__ = [
    "Catalog",
    "data_file",
    "get_gpu",
    "get_nic",
    "gpu_catalog",
    "gpu_names",
    "nic_catalog",
    "nic_names",
    "read_catalog",
]

S = TypeVar("S", bound=BaseModel)


class Catalog(Generic[S]):
    """An immutable name -> spec mapping plus an alias index for forgiving lookups."""

    def __init__(self, what: str, specs: Mapping[str, S], spellings: Mapping[str, str]) -> None:
        self.what = what
        self.specs: Mapping[str, S] = MappingProxyType(dict(specs))
        self._spellings = MappingProxyType(dict(spellings))

    def names(self) -> list[str]:
        """Canonical names, sorted."""
        return sorted(self.specs)

    def resolve(self, name: str) -> str:
        """The canonical name for ``name`` or one of its aliases; SpecError if unknown."""
        if not isinstance(name, str):
            raise SpecError(f"{self.what} name must be a string, got {name!r}")
        key = self._spellings.get(compact(name))
        if key is None:
            raise SpecError(unknown_name_message(self.what, name, self.specs, self._spellings))
        return key

    def get(self, name: str) -> S:
        """The spec for ``name`` (any accepted spelling); SpecError if unknown."""
        return self.specs[self.resolve(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and compact(name) in self._spellings

    def __len__(self) -> int:
        return len(self.specs)


def read_catalog(
    source: str | Path, model: type[S], table: str, text: str | None = None, what: str | None = None
) -> Catalog[S]:
    """Validate a catalog file (an array of ``[[table]]`` entries of ``model``) and index its spellings.

    ``text`` parses that string instead of reading ``source`` (which then only names it in errors).
    ``model`` needs ``name`` and ``aliases`` fields; ``what`` names an entry in messages ("GPU", "model").
    Raises SpecError naming the file and entry for bad values, duplicates or ambiguous aliases.
    """
    data = parse_toml(text, str(source)) if text is not None else read_toml(source, what="catalog file")
    what = what or ("GPU" if model is GPUSpec else "NIC")
    extra = sorted(set(data) - {table})
    if extra:
        raise SpecError(f"{source}: unknown top-level key {extra[0]!r}; a catalog holds only [[{table}]] tables")
    entries = data.get(table)
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{source}: no [[{table}]] entries; add at least one [[{table}]] table")
    specs: dict[str, S] = {}
    spellings: dict[str, str] = {}
    for i, entry in enumerate(entries):
        try:
            spec = model.model_validate(entry)
        except ValidationError as exc:
            raise spec_error(exc, str(source), model, prefix=(table, i)) from None
        if spec.name in specs:
            raise SpecError(f"{source}: {table}[{i}].name: {what} {spec.name!r} is defined twice; remove one")
        for spelling in (spec.name, *spec.aliases):
            owner = spellings.setdefault(compact(spelling), spec.name)
            if owner != spec.name:
                raise SpecError(
                    f"{source}: {table}[{i}].aliases: {spelling!r} already names {what} {owner!r}; "
                    "give each spelling to one entry only"
                )
        specs[spec.name] = spec
    return Catalog(what, specs, spellings)


def data_file(name: str) -> str:
    return str(resources.files("gpufleet").joinpath("data", name))


@functools.cache
def gpu_catalog() -> Catalog[GPUSpec]:
    """The shipped GPU catalog (``gpufleet/data/gpus.toml``), read on first use."""
    return read_catalog(data_file("gpus.toml"), GPUSpec, "gpus")


@functools.cache
def nic_catalog() -> Catalog[NICSpec]:
    """The shipped NIC catalog (``gpufleet/data/nics.toml``), read on first use."""
    return read_catalog(data_file("nics.toml"), NICSpec, "nics")


def get_gpu(name: str) -> GPUSpec:
    """Look up a GPU by catalog key or alias, case-insensitively; SpecError names the closest match."""
    return gpu_catalog().get(name)


def get_nic(name: str) -> NICSpec:
    """Look up a NIC by catalog key or alias, case-insensitively; SpecError names the closest match."""
    return nic_catalog().get(name)


def gpu_names() -> list[str]:
    """Canonical keys of the shipped GPU catalog, sorted."""
    return gpu_catalog().names()


def nic_names() -> list[str]:
    """Canonical keys of the shipped NIC catalog, sorted."""
    return nic_catalog().names()
