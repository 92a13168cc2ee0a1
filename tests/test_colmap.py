"""The one ``--columns`` parser: its form, the error type its caller names, aliases and case."""

from __future__ import annotations

import pytest

from gpufleet.colmap import parse_column_map
from gpufleet.errors import ConfigError, DiagnoseError, HealthError, MetaError, TraceError


def test_pairs_in_written_order_with_spaces_trimmed_and_keys_lower_cased() -> None:
    assert list(parse_column_map(" Rank = worker,step=time ").items()) == [("rank", "worker"), ("step", "time")]


def test_keys_kept_as_written_when_asked() -> None:
    assert parse_column_map("DCGM_FI_DEV_GPU_TEMP=temp", lower_keys=False) == {"DCGM_FI_DEV_GPU_TEMP": "temp"}


@pytest.mark.parametrize("error", [ConfigError, TraceError, DiagnoseError, HealthError, MetaError])
@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "--columns is empty"),
        ("rank", "--columns: malformed pair 'rank'"),
        ("rank=", "malformed pair 'rank='"),
        ("=x", "malformed pair '=x'"),
        ("rank=b,,step=d", "malformed pair ''"),
        ("gpu=x", "unknown key 'gpu'; accepted keys: rank, step"),
        ("rank=a,rank=b", "'rank' is given twice"),
    ],
)
def test_errors_are_the_callers_type_and_say_the_fix(error: type[Exception], text: str, match: str) -> None:
    with pytest.raises(error, match=match):
        parse_column_map(text, keys=("rank", "step"), error=error, example="rank=worker")


def test_two_aliases_of_one_column_are_refused() -> None:
    aliases = {"submit": "submit_s", "submit_s": "submit_s", "gpus": "num_gpus"}
    with pytest.raises(TraceError, match="'submit_s' and 'submit' both name 'submit_s'"):
        parse_column_map("submit=a,submit_s=b", keys=aliases, error=TraceError)
    assert parse_column_map("submit=a,gpus=g", keys=aliases) == {"submit": "a", "gpus": "g"}
