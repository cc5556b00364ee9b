"""What a request's newest `RequestOutput` adds to what its client has already been sent: the
`StreamDelta` the engine loop hands over (for one sample, or for each of a request's `n`), and
whether it is due yet (`AsyncEngine`'s `stream_interval`).

Outputs are snapshots (every token so far); the loop remembers, per request and sample, how many
tokens and characters went out and whether the sample's end did (`Sent`), and sends the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

from inflight.engine.outputs import RequestOutput
from inflight.serve.output_collector import StreamDelta

__all__ = ["Sent", "is_due", "make_delta"]


@dataclass
class Sent:
    """What one sample's client has been sent: tokens, characters, and whether its end."""

    tokens: int = 0
    chars: int = 0
    ended: bool = False


def is_due(out: RequestOutput, sent: list[Sent], interval: int) -> bool:
    """Whether `out` goes to its client now: the first output at once, an end at once, else every
    `interval` new tokens of some sample."""
    if out.finished or not sent:
        return True
    return any(len(o.token_ids) - s.tokens >= interval or (o.finished and not s.ended)
               for o, s in zip(out.outputs, sent))


def make_delta(out: RequestOutput, sent: list[Sent]) -> StreamDelta:
    """What `out` adds to `sent` (which it then updates, in place; empty when nothing went out yet)."""
    first = not sent
    if first:
        sent.extend(Sent() for _ in out.outputs)
    parts = {}
    for o, s in zip(out.outputs, sent):
        text = o.text or ""
        d = StreamDelta(o.token_ids[s.tokens:], text[s.chars:], o.finish_reason, o.error,
                        None if o.logprobs is None else o.logprobs[s.tokens:])
        if len(out.outputs) == 1 or d.token_ids or d.text or (o.finished and not s.ended):
            parts[o.index] = d
        s.tokens, s.chars, s.ended = len(o.token_ids), len(text), o.finished
    prompt = out.prompt_logprobs if first else None
    if len(out.outputs) == 1:
        delta = parts[0]
        delta.prompt_logprobs = prompt
        return delta
    failed = next((o for o in out.outputs if o.finish_reason == "error"), None)
    finish = None if not out.finished else "error" if failed is not None else out.finish_reason
    return StreamDelta(finish_reason=finish, error=failed.error if failed is not None else None,
                       prompt_logprobs=prompt, samples=parts)
