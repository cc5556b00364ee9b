"""`SamplingParams`: how a request picks each next token and when it stops (vLLM's names).

The sampler that applies them to a batch of logits is `inflight.model.sampler.Sampler` (it sits
beside the model, as vLLM's and nano-vllm's do), shared with the reference generator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from inflight.checks import integer, number, token_ids

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
        """Check every field (the engine calls this again at submission, since fields may have been
        changed after construction) and store each in its plain form; clear errors, no guessing."""
        self.max_tokens = integer("max_tokens", self.max_tokens, minimum=1)
        self.temperature = number("temperature", self.temperature, minimum=0.0)  # 0 = greedy
        self.top_p = number("top_p", self.top_p, above=0.0, maximum=1.0)
        stops = self.stop_token_ids
        if isinstance(stops, (set, frozenset)):  # order doesn't matter for stop tokens
            stops = sorted(stops)
        self.stop_token_ids = tuple(token_ids("stop_token_ids", stops))
        if self.seed is not None:
            self.seed = integer("seed", self.seed)
        self.priority = integer("priority", self.priority)
        self.ignore_eos = bool(self.ignore_eos)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
