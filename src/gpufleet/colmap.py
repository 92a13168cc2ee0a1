"""The ``--columns`` mapping every reader of user files accepts: ``"key=column,key=column"`` to a dict.

One parser for job traces, telemetry, step timings and interactions, so the form and its errors are the same
everywhere: pairs separated by commas, each ``KEY=COLUMN`` with both sides non-empty, each key (or each thing
that aliases name) at most once. The caller says which keys it accepts and which of gpufleet's error types to
raise; every message starts with ``--columns`` and names the pair and the fix.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gpufleet.errors import ConfigError, GpufleetError

__all__ = ["parse_column_map"]


def parse_column_map(
    text: str,
    *,
    keys: Mapping[str, str] | Collection[str] | None = None,
    error: type[GpufleetError] = ConfigError,
    example: str = "key=column",
    pairs: str = "key=column",
    lower_keys: bool = True,
) -> dict[str, str]:
    """Parse ``text`` (``"rank=worker, step=time"``) into ``{key: column}``, in the order written.

    ``keys``: the accepted keys, or a mapping from each accepted key (aliases included) to what it names, so
    that two aliases of one thing are refused like a repeated key; None accepts any key. ``lower_keys``
    lower-cases keys before checking and returning them (False keeps e.g. DCGM field names as written).
    ``pairs`` and ``example`` word the messages (``"canonical=source"``, a valid mapping). Raises ``error``
    (a :class:`~gpufleet.errors.GpufleetError` subclass) for an empty text, a malformed pair, an unknown key
    or a key given twice.
    """
    if not text or not text.strip():
        raise error(f"--columns is empty; give {pairs} pairs, e.g. '{example}'")
    names = keys if isinstance(keys, Mapping) else None
    result: dict[str, str] = {}
    seen: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if lower_keys:
            key = key.lower()
        if not sep or not key or not value:
            raise error(
                f"--columns: malformed pair '{part.strip()}' in '{text}'; expected {pairs} pairs separated by "
                f"commas, e.g. '{example}'"
            )
        if keys is not None and key not in keys:
            raise error(f"--columns: unknown key '{key}'; accepted keys: {', '.join(keys)} (e.g. '{example}')")
        named = names[key] if names is not None else key
        if named in seen:
            other = seen[named]
            what = f"'{key}' is given twice" if other == key else f"'{key}' and '{other}' both name '{named}'"
            raise error(f"--columns: {what} in '{text}'; give it once")
        seen[named] = key
        result[key] = value
    return result
