"""What the engine reports: `RequestOutput` per request (vLLM's name) and `StepStats` per iteration.

The timing vocabulary, used the same way everywhere in the book:
- TTFT, time to first token: from a request's arrival to its first generated token;
- TPOT, time per output token: a request's mean gap between tokens after the first,
  (last token time - first token time) / (tokens - 1);
- ITL, inter-token latency: each single gap between two consecutive tokens of a request
  (its percentiles show stalls that a mean like TPOT hides);
- queue time: from a request's arrival to the step that first admitted it (part of its TTFT).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.sequence import Sequence

__all__ = ["RequestOutput", "StepStats", "RunTotals", "request_output"]


@dataclass
class RequestOutput:
    """A request's state as the caller sees it (a snapshot: later steps don't change it)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens only
    text: str | None
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None while running
    finished: bool
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
    token_times: list[float] = field(default_factory=list, repr=False)
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at the last admission
    error: str | None = None  # why it ended, when finish_reason is "error" (the other requests went on)
    first_scheduled_time: float | None = None  # when a step first admitted it
    stop_reason: str | None = None  # the stop string that ended it, if one did

    @property
    def ttft(self) -> float | None:
        """Time to first token (seconds): arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to the step that first admitted it (None before that)."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (seconds); None with fewer than two tokens."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies (seconds): every gap between two consecutive generated tokens."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


def request_output(s: "Sequence", text: str | None) -> RequestOutput:
    """A snapshot of request `s` (with its generated text, when there is a tokenizer)."""
    return RequestOutput(s.request_id, s.prompt_token_ids, s.output_token_ids, text, s.finish_reason,
                         s.finish_reason is not None, s.arrival_time, s.first_token_time, s.finish_time,
                         list(s.token_times), s.num_preemptions, s.num_cached_tokens, s.error,
                         s.first_scheduled_time, getattr(s.detokenizer, "stop_reason", None))


@dataclass(slots=True)
class StepStats:
    """One iteration, measured: who ran, what it cost, where the time went (seconds)."""

    step: int
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_swapped: int
    blocks_used: int
    num_preempted: int
    blocks_swapped: int
    num_finished: int
    schedule_time: float   # reap + budget + admit + preempt (+ swap copies)
    prepare_time: float    # building input tensors and attention metadata
    forward_time: float    # the model
    sample_time: float     # sampling + bookkeeping after the forward pass
    start_time: float = 0.0

    @property
    def step_time(self) -> float:
        return self.schedule_time + self.prepare_time + self.forward_time + self.sample_time


@dataclass
class RunTotals:
    """Running totals over every step of an engine's life (its `stats` keep only a recent window)."""

    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    blocks_swapped: int = 0
    finished_requests: int = 0
    schedule_time: float = 0.0
    prepare_time: float = 0.0
    forward_time: float = 0.0
    sample_time: float = 0.0

    def add(self, st: StepStats) -> None:
        """Count one step."""
        self.steps += 1
        self.prefill_tokens += st.num_prefill_tokens
        self.decode_tokens += st.num_decode_tokens
        self.preemptions += st.num_preempted
        self.blocks_swapped += st.blocks_swapped
        self.finished_requests += st.num_finished
        self.schedule_time += st.schedule_time
        self.prepare_time += st.prepare_time
        self.forward_time += st.forward_time
        self.sample_time += st.sample_time

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
