"""Settings for the whole suite."""

import fcntl
import os

import pytest

# pytest-xdist's workers set COLUMNS=80, and the command line honours COLUMNS for piped output; the CLI tests
# read tables as a pipe would without it (160 columns), whichever way the suite is run.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


@pytest.fixture(autouse=True)
def _one_multiprocess_test_at_a_time(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Tests marked ``multiprocess`` (torchrun / gloo jobs of several ranks) hold one lock shared by the
    pytest-xdist workers, so no two multi-rank jobs share CI's 2 cores: their injected timing faults are
    measured against the other ranks, and eight ranks on two cores blur them."""
    if request.node.get_closest_marker("multiprocess") is None:
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "multiprocess.lock"  # the run's folder, shared by workers
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
