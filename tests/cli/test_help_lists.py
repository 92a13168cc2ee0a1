"""``--help`` lists come from the plugin registries: every registered name is listed, a new plugin appears
with no edit to the command line, and ``gpufleet --help`` itself stays light (no registry is loaded)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpufleet import cli
from gpufleet.cli.common import HELP_LISTS, fill_help
from gpufleet.diagnose.localize import LOCALISERS
from gpufleet.health.models.base import MODELS
from gpufleet.health.readers import READERS as TELEMETRY_READERS
from gpufleet.sched.policy import POLICIES, Policy, policies_needing
from gpufleet.traces.inference import SOURCES
from gpufleet.traces.readers import READERS as TRACE_READERS

runner = CliRunner()

#: (command, registry): the command's --help lists every name of the registry
CASES = [
    (["simulate"], POLICIES),
    (["simulate"], TRACE_READERS),
    (["simulate"], SOURCES),
    (["traces", "info"], TRACE_READERS),
    (["traces", "convert"], TRACE_READERS),
    (["traces", "inference"], SOURCES),
    (["health", "import"], TELEMETRY_READERS),
    (["health", "train"], MODELS),
    (["health", "evaluate"], MODELS),
    (["diagnose", "analyze"], LOCALISERS),
]


def help_words(args: list[str]) -> set[str]:
    """The words of ``gpufleet ARGS --help``, box drawing and punctuation around them removed."""
    res = runner.invoke(cli.app, [*args, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert not any("{" + key + "}" in res.output for key in HELP_LISTS), "a registry placeholder was left unfilled"
    return set(re.findall(r"[\w.-]*\w", res.output))


@pytest.mark.parametrize(("args", "registry"), CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else v.kind)
def test_help_lists_every_registered_name(args, registry):
    names = registry.names()
    assert names
    assert set(names) <= help_words(args)


def test_network_policies_come_from_what_policies_declare():
    listed = fill_help("{network-policies}").split(", ")
    assert listed == policies_needing("network", POLICIES.names()) and "contention" in listed and "fifo" not in listed


class ToyPolicy(Policy):
    """A toy first-come policy, only to show that a new plugin reaches --help."""

    name = "toy-first-come"
    summary = "toy"

    def waiting_key(self, j: int, now: float) -> float:
        return float(self.sim.submit[j])  # type: ignore[union-attr]


class ToyModel:
    """A toy failure model, only to show that a new plugin reaches --help."""

    name = "toy-model"


def test_a_new_plugin_shows_in_help_with_no_edit():
    assert "toy-first-come" not in help_words(["simulate"])
    with POLICIES.added("toy-first-come", ToyPolicy), MODELS.added("toy-model", ToyModel):
        assert "toy-first-come" in help_words(["simulate"])
        assert "toy-model" in help_words(["health", "train"])
    assert "toy-model" not in help_words(["health", "evaluate"])


def test_every_placeholder_fills():
    for key in HELP_LISTS:
        text = fill_help("{" + key + "}")
        assert text and "{" not in text, key


def test_top_level_help_loads_no_registry():
    code = (
        "import sys; from gpufleet import cli; from typer.testing import CliRunner; "
        "r = CliRunner().invoke(cli.app, ['--help']); assert r.exit_code == 0; "
        "heavy = [m for m in ('torch', 'polars', 'gpufleet.sched.fifo', 'gpufleet.health.models.gbdt') "
        "if m in sys.modules]; print(heavy)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
