"""Every registered job-trace reader, on its own tiny sample file: auto-detection picks it, the sample loads
into the canonical schema, and an unknown option is a one-line TraceError. A new reader file is picked up."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import TraceError
from gpufleet.traces.canonical import ParsedTable
from gpufleet.traces.load import load_trace
from gpufleet.traces.readers import READERS, TraceReader, detect_reader, get_reader
from gpufleet.traces.schema import CANONICAL_COLUMNS


@pytest.mark.parametrize("name", READERS.plugin_names())
def test_reader_declares_itself(name: str) -> None:
    cls = READERS[name]
    assert issubclass(cls, TraceReader) and cls.name == name
    summary = READERS.summary(name)
    assert summary and "\n" not in summary, "a reader needs a one-line description for --help"
    assert all(s == s.lower() and s.startswith(".") for s in cls.suffixes)


@pytest.mark.parametrize("name", READERS.plugin_names())
def test_reader_reads_its_sample_into_the_canonical_schema(name: str, tmp_path: Path) -> None:
    path = READERS[name].write_sample(tmp_path)
    if READERS[name].suffixes or READERS[name].sniff(path) is not None:
        assert detect_reader(path) == name, "auto-detection must pick a reader for its own sample"
    parsed = get_reader(name).read(path)
    assert isinstance(parsed, ParsedTable) and parsed.rows_read >= 1
    load = load_trace(path, reader=name)
    assert load.reader == name and load.jobs.height >= 1 and load.rejected_total == 0
    assert list(load.jobs.columns[: len(CANONICAL_COLUMNS)]) == list(CANONICAL_COLUMNS)
    assert (load.jobs["submit_s"].diff().drop_nulls() >= 0).all()


@pytest.mark.parametrize("name", READERS.plugin_names())
def test_reader_rejects_an_unknown_option_in_one_line(name: str) -> None:
    with pytest.raises(TraceError) as info:
        get_reader(name, no_such_option=1)
    assert "no_such_option" in str(info.value) and "\n" not in str(info.value)


def test_unknown_reader_lists_the_registered_ones() -> None:
    with pytest.raises(TraceError, match=r"^unknown trace reader 'nope'; available readers: .*\bphilly\b"):
        get_reader("nope")
