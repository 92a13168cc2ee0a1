"""Read a TOML file into a dict, turning every way that can fail into one SpecError naming the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from gpufleet.errors import SpecError


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """Parse TOML ``text``; ``source`` names where it came from in the error message."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML: {exc}; fix the syntax at that position") from None


def read_toml(path: str | Path, what: str = "file") -> dict[str, Any]:
    """Read and parse the TOML file at ``path``; ``what`` ("cluster file", ...) is used in messages."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: {what} not found; check the path (relative paths start at {Path.cwd()})") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory, not a {what}; pass the path of a .toml file") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: {what} is not UTF-8 text ({exc.reason}); save it as UTF-8 TOML") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read {what}: {exc.strerror}") from None
    return parse_toml(text, str(path))
