"""A registry of named factories, so that ``--reader philly`` or ``--policy aryl`` is a lookup, not an if-chain.

One :class:`Registry` per kind of pluggable thing (policies, trace readers, telemetry readers, failure models,
localisers, inference-load sources)::

    READERS: Registry[TraceReader] = Registry("trace reader", TraceError, package="gpufleet.traces.readers")

    @READERS.register("philly")
    class PhillyReader(TraceReader): ...

    READERS.create("philly")  # a new PhillyReader; an unknown name raises TraceError listing the names

With ``package``, every module of that package is imported on the first lookup, so a new plugin is one new
file in the package and no list of names is kept by hand. Each entry carries a one-line summary for
``--help`` lists (:meth:`Registry.help_text`).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Callable, ItemsView, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from gpufleet.errors import GpufleetError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def first_line(factory: Any) -> str:
    """A factory's one-line summary: its ``summary`` or ``description`` attribute, else its docstring's first line."""
    for attr in ("summary", "description"):
        text = getattr(factory, attr, None)
        if isinstance(text, str) and text.strip():
            return text.strip().splitlines()[0]
    doc = inspect.getdoc(factory) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


class Registry(Generic[T]):
    """Names mapped to factories (usually classes) of ``T``, each with a one-line summary.

    ``kind`` names what is registered in error messages (``"trace reader"``); ``error`` is the exception
    raised for an unknown name, with the message ``unknown <kind> '<name>'; <listing>: a, b, c`` where
    ``listing`` defaults to ``available <kind>s`` and ``empty`` stands in for the list when nothing is
    registered (with ``suggest``: ``unknown <kind> '<name>'. Did you mean 'x'? <listing>: ...``).
    With ``set_name``, :meth:`register` sets ``name`` on classes that have that attribute.

    ``package`` names the package whose modules hold the built-in entries: they are imported on the first
    lookup. A module whose import fails for lack of one of the ``optional`` top-level packages (an extra
    that is not installed) is skipped, so its entries are absent.
    """

    def __init__(
        self,
        kind: str,
        error: type[GpufleetError] = GpufleetError,
        *,
        listing: str | None = None,
        empty: str = "none",
        set_name: bool = True,
        package: str | None = None,
        optional: tuple[str, ...] = (),
        suggest: bool = False,
    ) -> None:
        self.kind = kind
        self.error = error
        self.listing = listing if listing is not None else f"available {kind}s"
        self.empty = empty
        self.set_name = set_name
        self.package = package
        self.optional = optional
        self.suggest = suggest
        self._entries: dict[str, Callable[..., T]] = {}
        self._summaries: dict[str, str] = {}
        self._discovered = package is None

    # -- registering -------------------------------------------------------------------------------
    def register(self, name: str, summary: str | None = None) -> Callable[[F], F]:
        """Decorator: make the factory available under ``name``; ``summary`` defaults to :func:`first_line`."""

        def decorate(factory: F) -> F:
            if self.set_name and isinstance(factory, type) and hasattr(factory, "name"):
                factory.name = name  # type: ignore[attr-defined]
            self._entries[name] = factory
            self._summaries[name] = summary if summary is not None else first_line(factory)
            return factory

        return decorate

    def discover(self) -> None:
        """Import every module of :attr:`package` once (their decorators register the built-in entries)."""
        if self._discovered:
            return
        self._discovered = True  # set first: a plugin module may look names up while it is being imported
        try:
            pkg = importlib.import_module(self.package)  # type: ignore[arg-type]
            for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
                module = f"{self.package}.{info.name}"
                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    top = (exc.name or "").split(".")[0]
                    if top not in self.optional:
                        raise
        except BaseException:
            self._discovered = False  # a failed import is raised again next time, never a quietly partial list
            raise

    # -- looking up --------------------------------------------------------------------------------
    def registered(self, name: str) -> Callable[..., T] | None:
        """The factory registered as ``name`` so far, without discovering the package (None when absent).

        For callers that imported the defining module themselves and must not import every other plugin."""
        return self._entries.get(name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self.discover()
        return sorted(self._entries)

    def plugin_names(self) -> list[str]:
        """The names whose factory lives in :attr:`package` (what conformance tests cover), sorted.

        Entries registered from elsewhere (a test's stand-in model) are left out; without a package, all names.
        """
        if self.package is None:
            return self.names()
        inside = (self.package, f"{self.package}.")
        return [n for n in self.names() if str(getattr(self._entries[n], "__module__", "")).startswith(inside)]

    def get(self, name: str) -> Callable[..., T]:
        """The factory registered as ``name``; :attr:`error` listing the known names otherwise."""
        self.discover()
        try:
            return self._entries[name]
        except KeyError:
            raise self.error(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        """The one-line message for an unknown ``name``."""
        known = self.names()
        listed = f"{self.listing}: {', '.join(known) or self.empty}"
        if not self.suggest:
            return f"unknown {self.kind} '{name}'; {listed}"
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return f"unknown {self.kind} '{name}'.{hint} {listed}"

    def create(self, name: str, **options: Any) -> T:
        """A new object from the factory registered as ``name``, called with ``options``.

        An option the factory's signature does not take is :attr:`error` naming the options it does take.
        """
        factory = self.get(name)
        check_options(factory, options, f"{self.kind} '{name}'", self.error)
        return factory(**options)

    def summary(self, name: str) -> str:
        """The one-line summary of ``name``."""
        self.get(name)
        return self._summaries[name]

    def summaries(self) -> dict[str, str]:
        """Every name with its one-line summary, sorted by name."""
        return {name: self._summaries[name] for name in self.names()}

    def help_text(self, sep: str = "; ") -> str:
        """``name: summary`` for every entry, joined by ``sep``: the text of a CLI option's ``--help``."""
        return sep.join(f"{name}: {text}" if text else name for name, text in self.summaries().items())

    @contextmanager
    def added(self, name: str, factory: Callable[..., T]) -> Iterator[None]:
        """Register ``factory`` as ``name`` for the duration of a ``with`` block (tests, toy plugins)."""
        self.discover()
        saved = self._entries.get(name), self._summaries.get(name)
        self.register(name)(factory)
        try:
            yield
        finally:
            if saved[0] is None:
                self._entries.pop(name, None)
                self._summaries.pop(name, None)
            else:
                self._entries[name], self._summaries[name] = saved[0], saved[1] or ""

    def detect(self, path: Path, fallback: str | None = None) -> str | None:
        """The entry that reads ``path``, from the suffixes and ``sniff`` of the registered readers.

        A reader declares ``suffixes`` (lower-case name endings) and may define ``sniff(path)``: True (mine),
        False (not mine) or None (no opinion). Among the readers claiming the suffix, the first (by name)
        whose sniff says True wins, else the first with no opinion. When no reader claims the suffix (or
        ``path`` is a folder), the first reader without suffixes whose sniff says True wins. Else ``fallback``.
        """
        name = "" if path.is_dir() else path.name.lower()
        entries = [(n, self._entries[n]) for n in self.names()]
        claim = [(n, f) for n, f in entries if name and name.endswith(tuple(getattr(f, "suffixes", ()) or ("\0",)))]
        if claim:
            verdicts = [(n, _sniff(f, path)) for n, f in claim]
            yes = [n for n, v in verdicts if v is True]
            maybe = [n for n, v in verdicts if v is None]
            return (yes or maybe or [fallback])[0]
        for n, f in entries:
            if not getattr(f, "suffixes", ()) and _sniff(f, path) is True:
                return n
        return fallback

    def items(self) -> ItemsView[str, Callable[..., T]]:
        """(name, factory) pairs in registration order."""
        self.discover()
        return self._entries.items()

    def __getitem__(self, name: str) -> Callable[..., T]:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self.discover()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self.discover()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"


def _sniff(factory: Any, path: Path) -> bool | None:
    sniff = getattr(factory, "sniff", None)
    return sniff(path) if callable(sniff) else None


def accepted_options(factory: Callable[..., Any], skip: tuple[str, ...] = ()) -> list[str] | None:
    """The keyword options ``factory`` takes; None when it takes any (its own code then checks them).

    A class whose ``__init__`` passes ``**kwargs`` on to its base's ``__init__`` takes the options of both.
    """
    inits = [factory]
    if isinstance(factory, type):
        inits = [c.__dict__["__init__"] for c in factory.__mro__ if "__init__" in c.__dict__]
    accepted: list[str] = []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for init in inits:
        if init is object.__init__:
            return None if inits[0] is not object.__init__ else accepted
        try:
            params = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):
            return None
        if isinstance(factory, type):
            params = params[1:]  # self
        accepted += [p.name for p in params if p.kind in kinds and p.name not in skip and p.name not in accepted]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return accepted
    return None


def check_options(
    factory: Callable[..., Any],
    options: dict[str, Any],
    what: str,
    error: type[GpufleetError] = GpufleetError,
    skip: tuple[str, ...] = (),
) -> None:
    """Raise ``error`` (one line) when ``options`` holds a name that ``factory`` does not take."""
    accepted = accepted_options(factory, skip)
    if accepted is None:
        return
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise error(f"{what} takes no option(s) {', '.join(unknown)}; its options are: {', '.join(accepted) or 'none'}")


class FileReader:
    """What every file-reading plugin declares, so that :meth:`Registry.detect` can choose among them.

    Trace readers and telemetry readers subclass it and add their own ``read``; ``kind`` names the plugin
    kind in messages (``"trace reader"``).
    """

    kind: ClassVar[str] = "reader"
    name: ClassVar[str] = ""
    #: one line for ``--help``
    description: ClassVar[str] = ""
    #: lower-case file-name endings this reader reads (auto-detection); none: it decides by :meth:`sniff`
    suffixes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def sniff(cls, path: Path) -> bool | None:
        """Whether ``path`` is in this reader's format: True, False, or None for no opinion (the suffix decides)."""
        return None

    @classmethod
    def write_sample(cls, folder: Path) -> Path:
        """Write a tiny file in this reader's format into ``folder`` (for the conformance tests); its path."""
        raise NotImplementedError(f"{cls.kind} {cls.name!r} has no write_sample")
