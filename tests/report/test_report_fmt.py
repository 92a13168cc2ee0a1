"""Formatting rules shared by tables and axes."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.report.fmt import format_duration, format_number, format_percent, time_axis_unit


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (42.0, "42.0 s"),
        (750.0, "12.5 min"),
        (7200.0, "2.00 h"),
        (45 * 3600.0, "45.0 h"),
        (4 * 86400.0, "4.00 d"),
        (None, "—"),
        (float("nan"), "—"),
        (np.float64(30.0), "30.0 s"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_percent_and_number() -> None:
    assert format_percent(0.632) == "63.2 %"
    assert format_percent(None) == "—"
    assert format_number(1234567) == "1,234,567"
    assert format_number(np.int64(12)) == "12"
    assert format_number(3.0) == "3"
    assert format_number(0.123456) == "0.1235"
    assert format_number("fifo") == "fifo"


def test_time_axis_unit_switches_to_days_after_three_days() -> None:
    assert time_axis_unit(3 * 86400.0) == ("h", 3600.0)
    assert time_axis_unit(3 * 86400.0 + 1) == ("d", 86400.0)
