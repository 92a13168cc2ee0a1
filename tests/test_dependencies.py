"""The command line starts on the core dependencies alone: ``pip install gpufleet`` without extras runs it.

Every third-party module that ``import gpufleet.cli`` loads must come from a distribution that the core
``[project.dependencies]`` pull in, directly or through their own requirements (typer vendors click, so an
``import click`` passes in a dev environment and fails after a plain install: this test is what catches it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _core_closure() -> set[str]:
    """The core requirements and everything they require (markers with extras are left out)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    todo = [_NAME.match(req)[0] for req in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo.extend(_NAME.match(req)[0] for req in requires if "extra ==" not in req)
    return seen


def _top_modules(imports: str) -> set[str]:
    """Top-level modules loaded by a fresh interpreter after ``imports``."""
    code = f"{imports}import sys, json; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(json.loads(done.stdout))


def test_cli_imports_only_core_dependencies() -> None:
    # what the interpreter loads before any import (site hooks, .pth files) is the machine's, not gpufleet's
    loaded = _top_modules("import gpufleet.cli; ") - _top_modules("")
    owners = metadata.packages_distributions()
    allowed = _core_closure() | {"gpufleet"}
    outside = {
        module: sorted({_canonical(d) for d in owners[module]})
        for module in loaded
        if module in owners and not {_canonical(d) for d in owners[module]} & allowed
    }
    assert not outside, f"`import gpufleet.cli` loads modules outside the core dependencies: {outside}"
