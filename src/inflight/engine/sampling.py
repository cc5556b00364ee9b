"""`SamplingParams`: how a request picks each next token and when it stops (vLLM's names).

The sampler that applies them to a batch of logits is `inflight.model.sampler.Sampler` (it sits
beside the model, as vLLM's and nano-vllm's do), shared with the reference generator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from inflight.checks import INT64_MAX, SEED_RANGE, flag, integer, number, priority, seed, show, token_ids

__all__ = ["SamplingParams", "SAMPLING_EPS", "MAX_LOGPROBS", "sample_seed"]

#: The most alternatives `logprobs` and `prompt_logprobs` may ask for per token (OpenAI's
#: `top_logprobs` limit, and vLLM's default `max_logprobs`).
MAX_LOGPROBS = 20

#: Temperatures below this sample greedily (vLLM's `_SAMPLING_EPS`): dividing logits by a smaller
#: temperature overflows in float32 and turns the probabilities into NaN.
SAMPLING_EPS = 1e-5


@dataclass
class SamplingParams:
    """How to pick each next token, and when to stop (vLLM's names).

    `temperature=0` is greedy, and so is any temperature below `SAMPLING_EPS` (it is stored as 0);
    `top_p < 1` keeps the smallest set of tokens whose probability reaches `top_p`; `seed` (a
    64-bit integer) makes a sampled request reproducible; `priority` (a 64-bit integer) orders
    admission and preemption (lower value first, ties by arrival). `stop` (a string or a list of
    them) ends the request where its text first contains one, checked on the detokenized text (it
    needs a tokenizer; the text ends before the stop string, as in vLLM and OpenAI's API).

    `n` samples are drawn from one prompt, prefilled once: the samples share its KV blocks and part
    ways at their first token (`inflight.engine.parallel_sampling`). With a `seed`, sample i draws
    from its own stream seeded `seed + i` (vLLM's rule), so sample 0 is what `n=1` gives.
    `logprobs=k` returns, for every generated token, its log-probability and the `k` most likely
    alternatives (0: the token's own only); `prompt_logprobs=k` the same for every prompt token but
    the first, which nothing predicts. Both at most `MAX_LOGPROBS`, both computed from the model's
    raw logits — before temperature and top-p, as vLLM's default `logprobs_mode="raw_logprobs"` —
    so they describe the model, whatever the sampling settings (`inflight.model.logprobs`).
    `skip_special_tokens=False` keeps special tokens' text (end-of-text written under `ignore_eos`)
    in the output text, except the end-of-text that ended the request (as vLLM leaves it out)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0
    stop: Sequence[str] = field(default_factory=tuple)
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field and store each in its plain form; clear errors, no guessing. (The
        engine validates a copy at submission, so a request keeps the parameters it was sent with
        even if the caller changes this object later.)"""
        self.max_tokens = integer("max_tokens", self.max_tokens, minimum=1)
        temperature = number("temperature", self.temperature, minimum=0.0)
        self.temperature = 0.0 if temperature < SAMPLING_EPS else temperature
        self.top_p = number("top_p", self.top_p, above=0.0, maximum=1.0)
        stops = self.stop_token_ids
        unordered = isinstance(stops, (set, frozenset))  # order doesn't matter for stop tokens
        stops = token_ids("stop_token_ids", list(stops) if unordered else stops)
        self.stop_token_ids = tuple(sorted(stops) if unordered else stops)
        if self.seed is not None:
            self.seed = seed("seed", self.seed)
        self.priority = priority("priority", self.priority)
        self.ignore_eos = flag("ignore_eos", self.ignore_eos)
        self.stop = stop_strings("stop", self.stop)
        self.n = integer("n", self.n, minimum=1, maximum=INT64_MAX)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                setattr(self, name, integer(name, getattr(self, name), minimum=0, maximum=MAX_LOGPROBS))
        self.skip_special_tokens = flag("skip_special_tokens", self.skip_special_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a request seeded `seed`: `seed + index`, wrapped into the 64-bit
    range `torch.Generator.manual_seed` takes (None stays None: unseeded samples share a stream)."""
    if seed is None:
        return None
    lo, hi = SEED_RANGE
    s = seed + index
    return s if s <= hi else s - (hi + 1)


def stop_strings(name: str, value: object) -> tuple[str, ...]:
    """Stop strings as a tuple: one string, or a list/tuple of them; none may be empty (an empty
    string would stop every request before its first character)."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{name} must be a string or a list of strings, got {type(value).__name__} ({show(value)})")
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise TypeError(f"{name}[{i}] must be a string, got {type(s).__name__} ({show(s)})")
        if not s:
            raise ValueError(f"{name}[{i}] is an empty string, which would stop every request at once")
    return tuple(items)
