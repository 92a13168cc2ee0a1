"""Human-readable formatting of durations, shares and counts, and unit choice for time axes.

One place for these rules so that tables and plot axes of every report agree.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = [
    "clean_json",
    "duration_unit",
    "format_duration",
    "format_fixed",
    "format_number",
    "format_percent",
    "format_span",
    "format_step_time",
    "format_tokens",
    "is_missing",
    "time_axis_unit",
]

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

#: Missing values print as this.
DASH = "—"


def is_missing(value: Any) -> bool:
    """True for None and NaN (a run that did not produce the number)."""
    return value is None or (isinstance(value, numbers.Real) and math.isnan(value))


def duration_unit(max_seconds: float) -> tuple[str, float]:
    """Pick ``(unit, seconds_per_unit)`` among s, min, h, d so that ``max_seconds`` reads naturally."""
    if not max_seconds or not math.isfinite(max_seconds) or max_seconds < 2 * MINUTE:
        return "s", 1.0
    if max_seconds < 2 * HOUR:
        return "min", MINUTE
    if max_seconds < 3 * DAY:
        return "h", HOUR
    return "d", DAY


def time_axis_unit(span_seconds: float) -> tuple[str, float]:
    """Unit of a timeline's x axis: hours, or days when the span is longer than three days."""
    return ("d", DAY) if span_seconds > 3 * DAY else ("h", HOUR)


def format_duration(seconds: Any) -> str:
    """Format seconds as ``"42.0 s"``, ``"12.5 min"``, ``"3.20 h"`` or ``"4.10 d"``; missing → ``"—"``."""
    if is_missing(seconds):
        return DASH
    s = float(seconds)
    if math.isinf(s):
        return "∞"
    unit, scale = duration_unit(abs(s))
    value = s / scale
    digits = 1 if unit in ("s", "min") or abs(value) >= 10 else 2
    return f"{value:.{digits}f} {unit}"


def format_percent(share: Any) -> str:
    """Format a share (a fraction, 0.632) as ``"63.2 %"``; missing → ``"—"``."""
    if is_missing(share):
        return DASH
    return f"{100.0 * float(share):.1f} %"


def format_number(value: Any) -> str:
    """Format a count or other number compactly: integers with thousands separators, floats to 4 digits."""
    if is_missing(value):
        return DASH
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        x = float(value)
        return f"{int(x):,}" if x.is_integer() and abs(x) < 1e15 else f"{x:.4g}"
    return str(value)


def format_span(seconds: Any) -> str:
    """Coarse duration for summary tables: ``"42 s"``, ``"12.5 min"``, ``"3.2 h"``, ``"4.1 d"``; missing → ``"—"``."""
    if seconds is None or not math.isfinite(seconds):
        return DASH
    if seconds < 2 * MINUTE:
        return f"{seconds:.0f} s"
    if seconds < 2 * HOUR:
        return f"{seconds / MINUTE:.1f} min"
    if seconds < 3 * DAY:
        return f"{seconds / HOUR:.1f} h"
    return f"{seconds / DAY:.1f} d"


def format_step_time(seconds: Any) -> str:
    """Fine duration for step times: ``"1,234 s"``, ``"12.34 s"``, ``"3.2 ms"``, ``"40 µs"``; missing → ``"—"``."""
    if seconds is None or not math.isfinite(seconds):
        return DASH
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def format_tokens(n: float) -> str:
    """A token count with binary multiples, as LLM papers write batches: ``"16M"`` for 16 x 2**20."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def format_fixed(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; NaN and infinity → ``"—"``."""
    return DASH if not math.isfinite(value) else f"{value:.{digits}f}"


def clean_json(value: Any) -> Any:
    """JSON-safe copy of ``value``: NaN and infinity become null, NumPy scalars plain numbers, dict keys strings;
    dicts, lists and tuples are cleaned recursively. The one helper every ``--json`` output goes through."""
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
