"""Reading files people exchange without running code from them: torch's weights-only loader, one-line reasons.

Every model or checkpoint gpufleet reads from a user-given path goes through ``torch.load(weights_only=True)``
(tensors, numbers, strings and containers of them), safetensors, JSON or LightGBM's text, never through a plain
unpickler. This module holds the torch part and the one-line wording of why a file was refused.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import IO, Any


def load_torch_weights(source: str | Path | IO[bytes], *, mmap: bool = False) -> Any:
    """``torch.load`` on CPU with ``weights_only=True``: an object other than tensors and plain values is refused.

    Raises what ``torch.load`` raises; pass the exception to :func:`why_unreadable` for a one-line reason.
    """
    import torch

    with warnings.catch_warnings():  # torch warns of a pickle protocol it did not write, then refuses the file
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)


def why_unreadable(exc: BaseException) -> str:
    """``TypeName: reason`` in one line. For a file torch's weights-only loader refused, its verdict (the message
    goes on for lines, down to advice to load with ``weights_only=False``, which gpufleet never does)."""
    text = str(exc)
    _, sep, verdict = text.partition("WeightsUnpickler error:")
    line = next((ln.strip() for ln in (verdict if sep else text).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {line.split('. Please use')[0]}"
