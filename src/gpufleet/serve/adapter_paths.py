"""Where a runtime-loaded adapter may come from: a folder inside the adapters root, and nowhere else.

``POST /v1/adapters {"name", "path"}`` names a PEFT folder relative to the server's ``--adapters`` root. The path
is refused when it has a ``..`` part, when it is absolute and outside the root, or when it (or a symlink on the
way) resolves outside the root; the resolved folder must hold ``adapter_config.json``. Names are what clients
send as ``model``: letters, digits, ``.``, ``_`` and ``-``, at most 128 characters.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath, PureWindowsPath

from gpufleet.errors import ServeError

ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class AdapterPathError(ServeError):
    """A runtime adapter's path or name is not allowed (HTTP 400)."""


def check_adapter_name(name: str) -> str:
    """``name`` when it is a valid adapter name; else AdapterPathError saying what a name may hold."""
    if not ADAPTER_NAME.match(name):
        raise AdapterPathError(
            f"adapter name {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def resolve_adapter_path(root: str | Path, path: str) -> Path:
    """The absolute folder ``path`` names inside ``root`` (symlinks resolved); AdapterPathError otherwise."""
    if not path or "\x00" in path:
        raise AdapterPathError("path: give the adapter folder relative to the adapters root, e.g. 'support-v2'")
    if ".." in PurePosixPath(path).parts or ".." in PureWindowsPath(path).parts:
        raise AdapterPathError(f"path {path!r}: '..' is not allowed; give a folder inside the adapters root")
    base = Path(root).resolve()
    given = Path(path)
    candidate = given if given.is_absolute() else base / given
    resolved = candidate.resolve()
    if not resolved.is_relative_to(base):
        where = "an absolute path outside" if given.is_absolute() else "a link that leads outside"
        raise AdapterPathError(f"path {path!r} is {where} the adapters root; only folders inside it can be loaded")
    if not (resolved / "adapter_config.json").is_file():
        raise AdapterPathError(
            f"path {path!r}: no PEFT adapter there (a folder with adapter_config.json and adapter_model.safetensors, "
            "saved with PeftModel.save_pretrained)"
        )
    return resolved
