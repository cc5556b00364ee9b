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

import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Sequence as Seq

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.sequence import Sequence

__all__ = ["RequestOutput", "CompletionOutput", "Logprob", "StepStats", "RunTotals", "request_output", "step_stats"]


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability (vLLM's `Logprob`): its value, its rank in the vocabulary
    (1 = the most likely) and its text (with a tokenizer)."""

    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One sample of a request (vLLM's `CompletionOutput`): `outputs[i]` of its `RequestOutput`.

    `logprobs[t]` (with `SamplingParams.logprobs`) maps token ids to `Logprob`s for the t-th
    generated token: the token itself, then the most likely alternatives, best first (the token
    may be one of them)."""

    index: int
    text: str | None
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | None = None
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    error: str | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list, repr=False)
    num_preemptions: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state as the caller sees it (a snapshot: later steps don't change it).

    `outputs` holds one `CompletionOutput` per sample (`SamplingParams.n`), in index order. The
    single-sample attributes (`token_ids`, `text`, `finish_reason`, `stop_reason`, `error`, the
    token times) are sample 0's, which for n=1 is the whole story; `finished` and `finish_time`
    are the request's (every sample ended), `num_preemptions` counts every sample's. `prompt_logprobs`
    (with `SamplingParams.prompt_logprobs`) has one entry per prompt token, None for the first."""

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
    outputs: list[CompletionOutput] = field(default_factory=list, repr=False)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = field(default=None, repr=False)

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


def completion_output(s: "Sequence", text: str | None) -> CompletionOutput:
    """A snapshot of one sample (with its generated text, when there is a tokenizer)."""
    return CompletionOutput(s.index, text, s.output_token_ids, s.finish_reason, getattr(s.detokenizer, "stop_reason",
                            None), s.cumulative_logprob, None if s.logprobs is None else list(s.logprobs), s.error,
                            s.first_token_time, s.finish_time, list(s.token_times), s.num_preemptions)


def request_output(samples: Seq["Sequence"], texts: Seq[str | None], n: int = 1) -> RequestOutput:
    """A snapshot of a request from its samples (sample 0 first) and their texts. Before the fork
    there is only sample 0; a request that ends then (aborted, or failed) reports its `n` samples
    all ended the same way, with no tokens."""
    first = samples[0]
    if n == 1:  # the common case, on every step's path: the request is its one sample
        head = completion_output(first, texts[0])
        return RequestOutput(first.request_id, first.prompt_token_ids, head.token_ids, head.text, head.finish_reason,
                             head.finish_reason is not None, first.arrival_time, head.first_token_time,
                             head.finish_time, head.token_times, first.num_preemptions, first.num_cached_tokens,
                             head.error, first.first_scheduled_time, head.stop_reason, [head],
                             None if first.prompt_logprobs is None else list(first.prompt_logprobs))
    outs = [completion_output(s, t) for s, t in zip(samples, texts)]
    head = outs[0]
    for i in range(len(outs), n):  # (only a request that ended before its fork)
        outs.append(CompletionOutput(i, None if head.text is None else "", [], head.finish_reason, None,
                                     None if first.logprobs is None else 0.0, None if first.logprobs is None else [],
                                     head.error, finish_time=head.finish_time))
    finished = all(o.finished for o in outs)
    finish = max(o.finish_time for o in outs if o.finish_time is not None) if finished else None
    return RequestOutput(first.request_id, first.prompt_token_ids, head.token_ids, head.text, head.finish_reason,
                         finished, first.arrival_time, head.first_token_time, finish, head.token_times,
                         sum(s.num_preemptions for s in samples), first.num_cached_tokens, head.error,
                         first.first_scheduled_time, head.stop_reason, outs,
                         None if first.prompt_logprobs is None else list(first.prompt_logprobs))


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


def step_stats(step: int, batch, sched, events, num_finished: int, t0: float, t1: float, times) -> StepStats:
    """The record of one step: its batch (`SchedulerOutput`), the scheduler's queues and pool after it,
    its events, and its clock: `t0` its start, `t1` the end of scheduling, `times` the runner's parts
    (what is left of the step after them is bookkeeping, recorded as `sample_time`)."""
    bookkeeping = time.perf_counter() - t1 - times.prepare - times.forward
    return StepStats(
        step=step, batch_size=len(batch.seqs), num_prefill_tokens=batch.num_prefill_tokens,
        num_decode_tokens=batch.num_decode_tokens, num_running=len(sched.running), num_waiting=len(sched.waiting),
        num_swapped=len(sched.swapped), blocks_used=sched.allocator.num_used, num_preempted=len(events.preempted),
        blocks_swapped=events.blocks_swapped_out + events.blocks_swapped_in, num_finished=num_finished,
        schedule_time=t1 - t0, prepare_time=times.prepare, forward_time=times.forward, sample_time=bookkeeping,
        start_time=t0)


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
