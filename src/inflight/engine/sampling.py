"""`SamplingParams` and the batched sampler: greedy, temperature, top-p, per-request seeds.

Determinism regardless of batch composition: each row's probabilities depend only on that row's
logits, and a seeded request draws its one uniform number per token from its *own*
`torch.Generator`. So a seeded request samples the same tokens alone or in a batch of 64, before
or after a preemption.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Sequence

import torch

__all__ = ["SamplingParams", "Sampler", "make_generator"]


@dataclass
class SamplingParams:
    """How to pick each next token, and when to stop (vLLM's names).

    `temperature=0` is greedy; `top_p < 1` keeps the smallest set of tokens whose probability
    reaches `top_p`; `seed` makes a sampled request reproducible; `priority` orders admission and
    preemption (lower value first, ties by arrival)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field (the engine calls this again at submission); clear errors, no defaults guessed."""
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, numbers.Integral):
            raise TypeError(f"max_tokens must be an int, got {type(self.max_tokens).__name__} ({self.max_tokens!r})")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        self.max_tokens = int(self.max_tokens)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, numbers.Real):
            raise TypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real):
            raise TypeError(f"top_p must be a number, got {type(self.top_p).__name__}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not hasattr(self.stop_token_ids, "__iter__"):
            raise TypeError(f"stop_token_ids must be a sequence of ints, got {type(self.stop_token_ids).__name__}")
        stops = tuple(self.stop_token_ids)
        for t in stops:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise TypeError(f"stop_token_ids must hold ints (token ids), got {t!r} ({type(t).__name__})")
            if t < 0:
                raise ValueError(f"stop_token_ids must be >= 0, got {t}")
        self.stop_token_ids = tuple(int(t) for t in stops)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, numbers.Integral):
            raise TypeError(f"priority must be an int, got {type(self.priority).__name__}")
        self.ignore_eos = bool(self.ignore_eos)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


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

    def __call__(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                 generators: Sequence[torch.Generator | None]) -> list[int]:
        """One token per row of `logits`; `params[i]` and `generators[i]` belong to row i."""
        greedy_ids = logits.argmax(dim=-1)
        if all(p.temperature == 0 for p in params):  # the common fast path: no per-row work
            return greedy_ids.tolist()
        rows = [i for i, p in enumerate(params) if p.temperature > 0]
        # one uniform per sampled row, each from its own stream when seeded
        u = torch.empty(len(rows), dtype=torch.float64)
        shared = [j for j, i in enumerate(rows) if generators[i] is None]
        if shared:
            u[shared] = torch.rand(len(shared), generator=self.generator, dtype=torch.float64)
        for j, i in enumerate(rows):
            if generators[i] is not None:
                u[j] = torch.rand(1, generator=generators[i], dtype=torch.float64).item()
        temps = torch.tensor([params[i].temperature for i in rows], dtype=torch.float32)
        top_p = torch.tensor([params[i].top_p for i in rows], dtype=torch.float64)
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
