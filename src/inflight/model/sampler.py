"""The batched sampler: greedy, temperature, top-p, per-request seeds.

Determinism regardless of batch composition: each row's probabilities depend only on that row's
logits, and a seeded request draws its one uniform number per token from its *own*
`torch.Generator`. So a seeded request samples the same tokens alone or in a batch of 64, before
or after a preemption. The engine and the reference generator (`inflight.model.generate`) both
sample through here.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["Sampler", "sample_rows", "make_generator"]


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator | None:
    """A request's own random stream (None for unseeded requests, which share the engine's)."""
    if seed is None:
        return None
    g = torch.Generator(device="cpu")  # draws happen on CPU: same numbers on every device
    g.manual_seed(int(seed))
    return g


class Sampler:
    """Turns a `[S, vocab]` block of float32 logits into one token id per row."""

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator(device="cpu")  # shared stream of unseeded requests
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
                 generators: Sequence[torch.Generator | None]) -> list[int]:
        """One token per row of `logits`; `temperatures[i]` (0 = greedy), `top_ps[i]` and
        `generators[i]` (None = the shared stream) belong to row i."""
        greedy_ids = logits.argmax(dim=-1)
        if not any(t > 0 for t in temperatures):  # the common fast path: no per-row work
            return greedy_ids.tolist()
        rows = [i for i, t in enumerate(temperatures) if t > 0]
        # one uniform per sampled row, each from its own stream when seeded
        u = torch.empty(len(rows), dtype=torch.float64)
        shared = [j for j, i in enumerate(rows) if generators[i] is None]
        if shared:
            u[shared] = torch.rand(len(shared), generator=self.generator, dtype=torch.float64)
        for j, i in enumerate(rows):
            if generators[i] is not None:
                u[j] = torch.rand(1, generator=generators[i], dtype=torch.float64).item()
        temps = torch.tensor([temperatures[i] for i in rows], dtype=torch.float32)
        top_p = torch.tensor([top_ps[i] for i in rows], dtype=torch.float64)
        picked = sample_rows(logits[rows].float().cpu(), temps, top_p, u)
        out = greedy_ids.tolist()
        for j, i in enumerate(rows):
            out[i] = picked[j]
        return out


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor) -> list[int]:
    """Inverse-CDF sampling of each row with its own temperature, top-p and uniform `u` in [0, 1).

    Tokens are sorted by probability (ties by token id, so the order is stable), the nucleus is
    the shortest prefix reaching `top_p`, and `u` picks a token inside it."""
    probs = torch.softmax(logits / temperature[:, None], dim=-1, dtype=torch.float64)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    cum = sorted_p.cumsum(-1)
    # keep token k if the mass before it is < top_p (so the first token is always kept)
    keep = (cum - sorted_p) < top_p[:, None]
    sorted_p = sorted_p * keep
    cum = sorted_p.cumsum(-1)
    target = u * cum[:, -1]
    idx = torch.searchsorted(cum, target[:, None], right=True).clamp(max=cum.shape[1] - 1)
    # searchsorted can land on a zero-probability tail entry only through rounding: step back to kept ones
    idx = torch.minimum(idx, keep.sum(-1, keepdim=True) - 1)
    return order.gather(1, idx).squeeze(1).tolist()
