"""Every registered telemetry reader, on its own tiny export: auto-detection picks it, the read is the
canonical frame, and an unknown option is a one-line HealthError. A new reader file is picked up."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from gpufleet.errors import HealthError
from gpufleet.health.frame import KEY_COLUMNS, TIME_DTYPE, TelemetryRead
from gpufleet.health.readers import READERS, TelemetryReader, detect_reader, get_reader, read_telemetry


@pytest.mark.parametrize("name", READERS.plugin_names())
def test_reader_declares_itself(name: str) -> None:
    cls = READERS[name]
    assert issubclass(cls, TelemetryReader) and cls.name == name
    summary = READERS.summary(name)
    assert summary and "\n" not in summary, "a reader needs a one-line description for --help"


@pytest.mark.parametrize("name", READERS.plugin_names())
def test_reader_reads_its_sample_into_the_canonical_frame(name: str, tmp_path: Path) -> None:
    path = READERS[name].write_sample(tmp_path)
    assert detect_reader(path) == name, "auto-detection must pick a reader for its own sample"
    read = read_telemetry(path, reader=name)
    assert isinstance(read, TelemetryRead) and read.malformed == 0
    frame = read.frame
    assert frame.height >= 2 and tuple(frame.columns[:3]) == KEY_COLUMNS
    assert frame.schema["gpu"] == pl.UInt32 and frame.schema["node"] == pl.UInt32
    assert frame.schema["time"] == TIME_DTYPE
    assert frame.equals(frame.sort("gpu", "time")), "rows are sorted by gpu, then time"
    assert frame.select("gpu", "time").is_duplicated().sum() == 0
    assert sorted(frame["gpu"].unique().to_list()) == list(range(frame["gpu"].n_unique()))


@pytest.mark.parametrize("name", READERS.plugin_names())
def test_reader_rejects_an_unknown_option_in_one_line(name: str) -> None:
    with pytest.raises(HealthError) as info:
        get_reader(name, no_such_option=1)
    assert "no_such_option" in str(info.value) and "\n" not in str(info.value)
