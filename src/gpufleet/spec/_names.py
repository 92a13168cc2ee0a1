"""Name normalisation and "did you mean" suggestions for catalog lookups.

Users type GPU and NIC names the way nvidia-smi, a job trace or a datasheet spells them
("Tesla V100-SXM2-32GB", "A100_80G", "HDR"); these helpers map them to one comparable form.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

_SEPARATORS = re.compile(r"[\s_/]+")
_DASHES = re.compile(r"-+")
_VENDOR_PREFIXES = ("nvidia-", "tesla-", "mellanox-")


def normalize(name: str) -> str:
    """Lower-case ``name``, turn spaces/underscores/slashes into dashes and drop vendor prefixes."""
    text = _SEPARATORS.sub("-", name.strip().lower())
    text = _DASHES.sub("-", text).strip("-")
    changed = True
    while changed:
        changed = False
        for prefix in _VENDOR_PREFIXES:
            if text.startswith(prefix):
                text = text[len(prefix) :]
                changed = True
    return text


def compact(name: str) -> str:
    """The matching key of ``name``: its normalised form without dashes ("A100-80G" -> "a10080g")."""
    return normalize(name).replace("-", "")


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def closest(name: str, candidates: Iterable[str] | Mapping[str, str]) -> list[str]:
    """The candidates most similar to ``name``: all those tied for the best score, or [] if none is close.

    Similarity is (length of common prefix, difflib ratio) on normalised forms, so "a100" finds both
    A100 variants and "h1000" finds "h100". ``candidates`` may map spellings (aliases) to the canonical
    name to return for them.
    """
    pairs = candidates.items() if isinstance(candidates, Mapping) else ((c, c) for c in candidates)
    query = normalize(name)
    scored: dict[str, tuple[int, float]] = {}
    for text, result in pairs:
        norm = normalize(text)
        prefix = _common_prefix(query, norm)
        ratio = difflib.SequenceMatcher(None, query, norm).ratio()
        if prefix >= 3 or ratio >= 0.7:
            scored[result] = max(scored.get(result, (0, 0.0)), (prefix, ratio))
    if not scored:
        return []
    best = max(scored.values())
    return sorted(r for r, score in scored.items() if score == best)


def unknown_name_message(
    what: str, name: object, valid: Iterable[str], spellings: Mapping[str, str] | None = None
) -> str:
    """One-line message for an unknown catalog name: what was asked, the closest match, all valid names.

    ``spellings`` (alias -> canonical name) widens the search for the closest match beyond ``valid``.
    """
    valid = sorted(valid)
    candidates = {v: v for v in valid} | dict(spellings or {})
    hints = closest(name, candidates) if isinstance(name, str) else []
    text = f"unknown {what} {name!r}"
    if hints:
        quoted = [repr(h) for h in hints]
        options = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        text += f" (did you mean {options}?)"
    return f"{text}; valid {what} names: {', '.join(valid)}"
