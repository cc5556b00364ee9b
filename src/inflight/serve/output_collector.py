"""Per-request output collectors: how tokens get from the engine loop to a client that reads at its
own pace (vLLM's `RequestOutputCollector`, `vllm/v1/engine/output_processor.py`).

The engine loop produces, after every step, a `StreamDelta` for each request that got new tokens.
It must never wait for a client: one slow reader would then slow every request in the batch. So
each request has a collector with room for exactly one pending delta. `put` never blocks: if the
reader has not taken the last delta yet, the new one is *merged* into it (tokens and text appended;
the newer delta's finish reason and error kept when it has one: a request that ended stays ended). A slow reader then costs memory bounded by its own request's tokens,
and when it reads it gets everything that came since, in one piece. The reader `await`s `get()`,
which waits on an `asyncio.Event` that `put` sets.

Everything here runs on the server's event loop (the engine thread hands each step's deltas over in
one `call_soon_threadsafe`), so a collector needs no lock.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

__all__ = ["StreamDelta", "RequestOutputCollector"]


@dataclass
class StreamDelta:
    """What one request got since the last delta: its new tokens, their text (whole characters
    only), and why it ended, if it did (`finish_reason` "stop", "length", "abort" or "error").

    With log-probabilities asked for, `logprobs` has one entry per new token (`RequestOutput`'s
    form), and the first delta carries the prompt's (`prompt_logprobs`). A request of `n > 1`
    samples gets its samples' deltas in `samples` (by index: only those that moved), and the
    request's own fields say only when it has ended (every sample has)."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # why, when finish_reason is "error"
    logprobs: list | None = None
    prompt_logprobs: list | None = None
    samples: dict[int, "StreamDelta"] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def merge(self, later: "StreamDelta") -> None:
        """Take in the delta that came after this one (an unread delta absorbs the next)."""
        self.token_ids.extend(later.token_ids)
        self.text += later.text
        if later.finish_reason is not None:  # (a delta that did not end the request changes no ending)
            self.finish_reason, self.error = later.finish_reason, later.error
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        for i, d in (later.samples or {}).items():
            if self.samples is None:
                self.samples = {}
            if i in self.samples:
                self.samples[i].merge(d)
            else:
                self.samples[i] = d


class RequestOutputCollector:
    """One pending `StreamDelta` (or exception) per request: `put` merges, `get` waits and takes."""

    def __init__(self) -> None:
        self.output: StreamDelta | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, item: StreamDelta | BaseException) -> None:
        """Hand over a delta (or an error); never waits. An unread delta absorbs the new one (in
        place: once put, a delta is the collector's); an error replaces a pending delta, and
        nothing after an error matters (a second error neither: the first is the cause)."""
        if isinstance(self.output, BaseException):
            return
        if self.output is None or isinstance(item, BaseException):
            self.output = item
            self.ready.set()
        elif isinstance(self.output, StreamDelta):
            self.output.merge(item)  # (tokens and text appended, the newer finish reason kept)

    def get_nowait(self) -> StreamDelta | None:
        """The pending delta (taken), or None; raises the pending error."""
        item, self.output = self.output, None
        self.ready.clear()
        if isinstance(item, BaseException):
            raise item
        return item

    async def get(self) -> StreamDelta:
        """Wait for a delta and take it (raises a pending error)."""
        while self.output is None:
            await self.ready.wait()
        return self.get_nowait()  # type: ignore[return-value]
