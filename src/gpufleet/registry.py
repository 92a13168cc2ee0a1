"""A registry of named factories, so that ``--reader philly`` or ``--model gbdt`` is a lookup, not an if-chain.

One :class:`Registry` per kind of pluggable thing (trace readers, telemetry readers, failure models)::

    READERS: Registry[TraceReader] = Registry("trace reader", TraceError, listing="available readers")

    @READERS.register("philly")
    class PhillyReader(TraceReader): ...

    READERS.create("philly")  # a new PhillyReader; an unknown name raises TraceError listing the names
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator
from typing import Any, Generic, TypeVar

from gpufleet.errors import GpufleetError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[T]):
    """Names mapped to factories (usually classes) of ``T``.

    ``kind`` names what is registered in error messages (``"trace reader"``); ``error`` is the exception
    raised for an unknown name, with the message ``unknown <kind> '<name>'; <listing>: a, b, c`` where
    ``listing`` defaults to ``available <kind>s`` and ``empty`` stands in for the list when nothing is
    registered. With ``set_name``, :meth:`register` sets ``name`` on classes that have that attribute.
    """

    def __init__(
        self,
        kind: str,
        error: type[GpufleetError] = GpufleetError,
        *,
        listing: str | None = None,
        empty: str = "none",
        set_name: bool = True,
    ) -> None:
        self.kind = kind
        self.error = error
        self.listing = listing if listing is not None else f"available {kind}s"
        self.empty = empty
        self.set_name = set_name
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: make the factory available under ``name``."""

        def decorate(factory: F) -> F:
            if self.set_name and isinstance(factory, type) and hasattr(factory, "name"):
                factory.name = name  # type: ignore[attr-defined]
            self._entries[name] = factory
            return factory

        return decorate

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> Callable[..., T]:
        """The factory registered as ``name``; :attr:`error` listing the known names otherwise."""
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or self.empty
            raise self.error(f"unknown {self.kind} '{name}'; {self.listing}: {known}") from None

    def create(self, name: str, **options: Any) -> T:
        """A new object from the factory registered as ``name``, called with ``options``."""
        return self.get(name)(**options)

    def items(self) -> ItemsView[str, Callable[..., T]]:
        """(name, factory) pairs in registration order."""
        return self._entries.items()

    def __getitem__(self, name: str) -> Callable[..., T]:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
