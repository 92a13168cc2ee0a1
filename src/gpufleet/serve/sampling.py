"""Next-token choice for a batch: greedy rows in one argmax, sampled rows with temperature and nucleus (top-p)
filtering, each from its own seeded generator so a request's output does not depend on its batch-mates."""

from __future__ import annotations

import torch

from gpufleet.serve.protocol import SamplingParams


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_next(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token id per row of ``logits`` [R, vocab] (fp32, on any device)."""
    greedy = logits.argmax(dim=-1).tolist()
    out = []
    for i, p in enumerate(params):
        out.append(greedy[i] if p.temperature <= 0 else _sample_row(logits[i].float().cpu(), p, generators[i]))
    return out
