"""The command line's two consoles, shared by every sub-app: tables to stdout, messages to stderr."""

from __future__ import annotations

from rich.console import Console

out = Console()
if not out.is_terminal:  # piped output: do not squeeze tables into 80 columns
    out = Console(width=160)
err = Console(stderr=True)
