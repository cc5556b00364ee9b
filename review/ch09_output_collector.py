"""Chapter 9: OutputCollector.put / get_nowait."""
import asyncio

from _harness import run

from inflight.exercises.output_collector import check_output_collector
from inflight.serve.output_collector import StreamDelta


class Base:
    def __init__(self):
        self.output = None
        self.ready = asyncio.Event()

    async def get(self):
        while self.output is None:
            await self.ready.wait()
        return self.get_nowait()


class Correct(Base):
    def put(self, item):
        pending = self.output
        if isinstance(pending, BaseException):
            return  # the loop died: nothing after it matters
        if pending is None or isinstance(item, BaseException):
            self.output = item
        else:
            self.output = StreamDelta(token_ids=[*pending.token_ids, *item.token_ids],
                                      text=pending.text + item.text,
                                      finish_reason=item.finish_reason)
        self.ready.set()

    def get_nowait(self):
        out, self.output = self.output, None
        self.ready.clear()
        if isinstance(out, BaseException):
            raise out
        return out


class W1NewFirst(Correct):
    # merges the new delta in front of the pending one
    def put(self, item):
        pending = self.output
        if isinstance(pending, BaseException):
            return
        if pending is None or isinstance(item, BaseException):
            self.output = item
        else:
            self.output = StreamDelta(token_ids=item.token_ids + pending.token_ids,
                                      text=item.text + pending.text,
                                      finish_reason=item.finish_reason)
        self.ready.set()


class W2DeltaOverException(Correct):
    # merges two deltas, otherwise the newest item replaces what is pending -- a pending exception too
    def put(self, item):
        pending = self.output
        if isinstance(pending, StreamDelta) and isinstance(item, StreamDelta):
            self.output = StreamDelta(token_ids=pending.token_ids + item.token_ids,
                                      text=pending.text + item.text,
                                      finish_reason=item.finish_reason)
        else:
            self.output = item
        self.ready.set()


class W3KeepsPending(Correct):
    # clears ready but never empties self.output: the same delta is read again and merged into
    def get_nowait(self):
        self.ready.clear()
        if isinstance(self.output, BaseException):
            raise self.output
        return self.output


ANSWERS = [
    ("correct", None, Correct),
    ("w1", "merge puts the new delta's tokens/text before the pending ones", W1NewFirst),
    ("w2", "a delta arriving after a pending exception replaces the exception", W2DeltaOverException),
    ("w3", "get_nowait never resets self.output (re-delivers, keeps merging)", W3KeepsPending),
]

if __name__ == "__main__":
    run("ch09", ANSWERS, check_output_collector)
