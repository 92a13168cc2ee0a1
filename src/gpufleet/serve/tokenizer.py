"""Text <-> token ids: the model folder's ``tokenizer.json`` through Hugging Face ``tokenizers``, or a byte-level
tokenizer for the random models (ids 0-255 are bytes; BOS and EOS follow), which need no download."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from gpufleet.errors import ServeError


class Tokenizer(Protocol):
    bos_id: int | None
    eos_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, BOS = 256, EOS = 257; ids past 257 decode to nothing."""

    bos_id = 256
    eos_ids = (257,)

    def encode(self, text: str) -> list[int]:
        return [self.bos_id, *text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizer.json`` (the fast tokenizers format every Llama repository ships)."""

    def __init__(self, path: Path, bos_id: int | None, eos_ids: tuple[int, ...]) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self._tok = RustTokenizer.from_file(str(path))
        self.bos_id, self.eos_ids = bos_id, eos_ids

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(base: str | Path, bos_id: int | None, eos_ids: tuple[int, ...]) -> Tokenizer:
    """The folder's tokenizer.json, or the byte tokenizer for a random model (or a folder without one)."""
    path = Path(base) / "tokenizer.json"
    if path.is_file():
        try:
            return HFTokenizer(path, bos_id, eos_ids)
        except ImportError as exc:
            raise ServeError(
                "reading tokenizer.json needs the `tokenizers` package: pip install 'gpufleet[serve]'"
            ) from exc
    return ByteTokenizer()
