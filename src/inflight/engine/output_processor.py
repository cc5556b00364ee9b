"""From the sequences a step touched to what the caller sees (vLLM's `v1/engine/output_processor.py`).

One `RequestOutput` per request, however many of its samples the step moved: each sample's new
tokens are turned into text (`IncrementalDetokenizer`, which also ends a sample at a stop string),
its log-probability entries get their tokens' text, and the request is snapshotted with all its
samples (`outputs.request_output`). A sample whose text cannot be decoded ends alone, with an error.
"""
from __future__ import annotations

from typing import Any, Sequence as Seq

from inflight.engine.detokenizer import text_token_ids
from inflight.engine.logprobs import fill_decoded
from inflight.engine.outputs import RequestOutput, request_output
from inflight.engine.parallel_sampling import request_samples
from inflight.engine.sequence import Sequence, fail

__all__ = ["request_heads", "request_output_now", "advance_request", "detokenize", "snapshot"]


def request_heads(touched: Seq[Sequence]) -> list[Sequence]:
    """The requests of the touched sequences, each once, in order: by their sample 0."""
    return list(dict.fromkeys(s if s.group is None else s.group.samples[0] for s in touched))


def request_output_now(head: Sequence, now: float, tokenizer: Any, eos_token_ids: frozenset[int] = frozenset()
                       ) -> RequestOutput:
    """The output of `head`'s request after this step's tokens; a sample whose text cannot be
    decoded ends with an error (the others go on)."""
    return snapshot(head, advance_request(head, now, tokenizer, eos_token_ids))


def advance_request(head: Sequence, now: float, tokenizer: Any, eos_token_ids: frozenset[int] = frozenset()
                    ) -> list[str | None]:
    """Everything a step's new tokens do to `head`'s request short of a snapshot: each sample's
    text so far (a stop string in it ends the sample; text that cannot be decoded ends it with an
    error) and its log-probability entries' text. Returns the samples' texts. (Run every step for
    every request touched, snapshot or not: a stop string must end a request when it appears.)"""
    samples = request_samples(head)
    texts: list[str | None] = []
    for s in samples:
        text, error = detokenize(s, now, eos_token_ids)
        if error is not None and s.finish_reason != "error":
            fail(s, error, now)
        if s.logprobs is not None:
            fill_decoded(s.logprobs, tokenizer)
        texts.append(text)
    if head.prompt_logprobs is not None:
        fill_decoded(head.prompt_logprobs, tokenizer)
    return texts


def detokenize(s: Sequence, now: float, eos_token_ids: frozenset[int] = frozenset()) -> tuple[str | None, str | None]:
    """(text so far, None) or (None, why it failed); a stop string in the new text ends `s`."""
    d = s.detokenizer
    if d is None:
        return None, None
    try:
        stop = d.update(text_token_ids(s, eos_token_ids), finished=s.finish_reason is not None)
    except Exception as exc:  # noqa: BLE001 - one request's tokens must not take the step down
        return None, f"detokenization failed ({type(exc).__name__}: {exc})"
    if stop is not None and s.finish_reason in (None, "length"):
        if s.finish_reason is None:
            s.finish_time = now
        s.finish_reason = "stop"
    return d.text(s.finish_reason is not None), None


def snapshot(head: Sequence, texts: list[str | None] | None) -> RequestOutput:
    """The output of `head`'s request from its samples' texts (None: not decoded)."""
    samples = request_samples(head)
    return request_output(samples, texts or [None] * len(samples), head.params.n)
