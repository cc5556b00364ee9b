"""`SamplingParams`: how a request picks each next token and when it stops (vLLM's names).

The sampler that applies them to a batch of logits is `inflight.model.sampler.Sampler` (it sits
beside the model, as vLLM's and nano-vllm's do), shared with the reference generator.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["SamplingParams"]


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
