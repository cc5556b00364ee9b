"""The engine's side of speculative decoding: one object `LLMEngine` holds when speculation is on.

Before each step's budget, `propose` asks the proposer for every decoding request's guesses (at most
k, fewer where `max_tokens` or the context would end the request sooner: a proposal past the end
could never be used) and leaves them in `Sequence.spec_token_ids`; after the pass, `record` adds
the step's drafts to the counters, and `stop_check` is what the scheduler runs after each token of a
multi-token step (the stop strings, on the text).
"""
from __future__ import annotations

from typing import Any

from inflight.engine.output_processor import detokenize
from inflight.engine.scheduler_types import StepEvents
from inflight.engine.sequence import Sequence, SequenceStatus
from inflight.engine.spec_decode.config import SpeculativeConfig, make_proposer
from inflight.engine.spec_decode.metrics import SpecDecodingMetrics

__all__ = ["Speculator", "NoSpeculation"]


class NoSpeculation:
    """What `LLMEngine` holds when speculation is off: every hook does nothing."""

    k, config, metrics, stop_check = 0, None, None, None

    def propose(self, running: list[Sequence]) -> None:
        pass

    def record(self, events: StepEvents) -> None:
        pass

    def stats(self) -> dict:
        return {}


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Any, max_model_len: int, eos_token_ids: frozenset[int]):
        self.config, self.proposer = config, proposer
        self.k = config.num_speculative_tokens
        self.max_model_len, self.eos_token_ids = max_model_len, eos_token_ids
        self.metrics = SpecDecodingMetrics(self.k)

    @classmethod
    def build(cls, spec: Any, engine: Any, num_blocks: int, max_batch_size: int) -> "Speculator | NoSpeculation":
        """`NoSpeculation` when `spec` is None; else a checked config and its proposer for `engine`'s model, KV
        block size and pool (ValueError/TypeError if bad)."""
        cfg = SpeculativeConfig.parse(spec)
        if cfg is None:
            return NoSpeculation()
        proposer = make_proposer(cfg, engine.config, device=engine.device, dtype=engine.dtype, num_blocks=num_blocks,
                                 block_size=engine.block_size, max_batch_size=max_batch_size)
        return cls(cfg, proposer, engine.max_model_len, engine.eos_token_ids)

    def propose(self, running: list[Sequence]) -> None:
        seqs, ks = [], []
        for s in running:
            s.spec_token_ids = []
            if s.finish_reason is None and s.status is SequenceStatus.RUNNING and s.num_tokens - s.num_computed_tokens == 1:
                room = min(self.k, s.params.max_tokens - s.num_output_tokens - 1, self.max_model_len - s.num_tokens - 1)
                if room > 0:
                    seqs.append(s)
                    ks.append(room)
        if seqs:
            for s, p in zip(seqs, self.proposer.propose(seqs, ks)):
                s.spec_token_ids = list(p)

    def record(self, events: StepEvents) -> None:
        for proposed, accepted in events.drafts:
            self.metrics.record(proposed, accepted)

    def stats(self) -> dict:
        return self.metrics.as_dict()

    def stop_check(self, s: Sequence, now: float) -> None:
        if s.detokenizer is not None and s.params.stop:
            detokenize(s, now, self.eos_token_ids)
