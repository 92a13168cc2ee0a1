"""Without a GPU, every Triton function of the serve tests is decorated under Triton's interpreter.

``triton.jit`` chooses interpreted or compiled when it decorates (module import), so the variable must be set
before any test imports a kernel module; a test that needs it unset removes it with ``monkeypatch``.
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("torch") is not None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
