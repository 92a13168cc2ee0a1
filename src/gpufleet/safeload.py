"""Reading files people exchange without running code from them: torch's weights-only loader, one-line reasons.

Every model or checkpoint gpufleet reads from a user-given path goes through ``torch.load(weights_only=True)``
(tensors, numbers, strings and containers of them), safetensors, JSON or LightGBM's text, never through a plain
unpickler. This module holds the torch part, bounded reads of zip members (a zip bomb is refused, not expanded)
and the one-line wording of why a file was refused.
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path
from typing import IO, Any

MiB = 2**20
#: the compression methods a member may use: anything else (bzip2, lzma, ...) is refused before decompressing
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}


class ArchiveMemberError(ValueError):
    """A zip member that is not read: an unusual compression method, or more bytes than its limit."""


def read_member(zf: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """The bytes of member ``name``, decompressing at most ``limit`` bytes; ArchiveMemberError beyond that.

    The size in the member's header is checked first, then the bytes themselves (a header can lie), so a
    small crafted member never expands into memory. KeyError when there is no such member.
    """
    return read_info(zf, zf.getinfo(name), limit)


def read_info(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """:func:`read_member` for a member already looked up."""
    if info.compress_type not in _METHODS:
        raise ArchiveMemberError(
            f"its {info.filename} is compressed with method {info.compress_type}; only stored and deflated "
            "members are read"
        )
    if info.file_size > limit:
        raise ArchiveMemberError(
            f"its {info.filename} expands to {_size(info.file_size)}, over the {_size(limit)} limit"
        )
    with zf.open(info) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ArchiveMemberError(f"its {info.filename} expands past the {_size(limit)} limit")
    return data


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


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
    name = type(exc).__name__
    if name.islower():  # zlib.error, binascii.error: the bare name says nothing
        name = f"{type(exc).__module__}.{name}"
    return f"{name}: {line.split('. Please use')[0]}"
