"""Grader for chapter 9: the per-request output collector (`inflight.serve.output_collector`).

The learner writes `put(item)` and `get_nowait()` of a collector that holds one pending
`StreamDelta` (or an exception) and an `asyncio.Event` `ready` that is set exactly while something
is pending; `get()` (given) waits on `ready`. Each case plays a script of puts, reads and looks at
`ready`, and compares what a reader would see with the package's `RequestOutputCollector`.
"""
from __future__ import annotations

import asyncio
import random
import threading
from typing import Any, Callable

from inflight.exercises.grading import Case, GradeResult, Mistake, call_with_time_limit, grade
from inflight.serve.output_collector import RequestOutputCollector, StreamDelta

__all__ = ["check_output_collector", "cases", "MISTAKES", "Broken", "slow_reader_demo"]


class Broken(RuntimeError):
    """The error the cases hand over (as the engine loop does when it dies)."""


def _seen(item: Any) -> Any:
    """What a reader learns from one get_nowait() result (type-strict: a StreamDelta with a list of
    ints, a str and a finish reason; anything else is shown as what it is)."""
    if item is None:
        return ("nothing",)
    if type(item) is not StreamDelta:
        return ("not a StreamDelta", type(item).__name__)
    ids = item.token_ids
    if type(ids) is not list or not all(type(t) is int for t in ids) or type(item.text) is not str:
        return ("malformed", type(ids).__name__, type(item.text).__name__)
    return ("delta", list(ids), item.text, item.finish_reason)


def _play(script: list[tuple]) -> Callable[[Any], list]:
    """A case: run `script` on a fresh collector of the given class; what the reader saw, step by step."""
    def run(cls: Any) -> list:
        c = cls()
        seen: list = []
        for op, *arg in script:
            if op == "put":
                c.put(StreamDelta(list(arg[0]), arg[1], arg[2] if len(arg) > 2 else None))
            elif op == "fail":
                c.put(Broken(arg[0]))
            elif op == "get":
                try:
                    seen.append(_seen(c.get_nowait()))
                except Broken as exc:
                    seen.append(("raised", str(exc)))
            elif op == "ready":
                ready = getattr(c, "ready", None)
                seen.append(("ready", ready.is_set() if isinstance(ready, asyncio.Event) else "no asyncio.Event"))
        return seen
    return run


def _describe(script: list[tuple]) -> str:
    def one(op, *arg):
        if op == "put":
            return f"put({list(arg[0])}, {arg[1]!r}{', ' + repr(arg[2]) if len(arg) > 2 else ''})"
        return {"fail": f"put(error {arg[0]!r})" if arg else "", "get": "get_nowait()", "ready": "ready?"}[op]
    return "; ".join(one(*s) for s in script)


_SCRIPTS = {
    "one delta, then nothing": [("ready",), ("put", [7], "a"), ("ready",), ("get",), ("ready",), ("get",)],
    "two deltas while the reader is away": [("put", [1], "a"), ("put", [2, 3], "bc"), ("ready",), ("get",), ("get",)],
    "the last delta ends it": [("put", [1], "a"), ("put", [2], "b"), ("put", [], "", "stop"), ("get",)],
    "read, then more": [("put", [1], "a"), ("get",), ("put", [2], "b"), ("put", [3], "c", "length"), ("get",),
                        ("ready",)],
    "an error replaces what is pending": [("put", [1], "a"), ("fail", "engine died"), ("ready",), ("get",),
                                          ("ready",), ("get",)],
    "nothing after an error matters": [("fail", "engine died"), ("put", [4], "d"), ("get",), ("get",)],
    "a reader far behind": [("put", [i], chr(97 + i % 26)) for i in range(300)] + [("get",), ("ready",)],
    "held-back text, then the rest": [("put", [226], ""), ("put", [130], ""), ("put", [172], "€"), ("get",)],
}


def _random_script(rng: random.Random) -> list[tuple]:
    script: list[tuple] = []
    tok = 0
    for _ in range(rng.randint(3, 25)):
        r = rng.random()
        if r < 0.55:
            n = rng.choice([0, 1, 1, 1, 2, 5])
            script.append(("put", list(range(tok, tok + n)), "".join(chr(97 + (tok + k) % 26) for k in range(n))))
            tok += n
        elif r < 0.85:
            script.append(("get",))
        elif r < 0.95:
            script.append(("ready",))
        else:
            script.append(("put", [], "", rng.choice(["stop", "length", "abort"])))
    return script + [("get",), ("ready",)]


def _wakes_the_reader(cls: Any) -> Any:
    """A reader waiting on `ready` in an event loop (a thread of its own: a notebook already runs
    one) while five deltas are put a few ms apart: it must wake for them and get them all, the last
    one ending the stream, and never be woken with nothing to take."""
    box: dict = {}

    async def main():
        c = cls()
        got: list = []

        async def reader():
            idle_wakeups = 0
            while True:
                await asyncio.wait_for(c.ready.wait(), 5)
                d = c.get_nowait()
                if d is None:  # woken with nothing pending: ready was left set
                    idle_wakeups += 1
                    if idle_wakeups > 100:
                        return "ready stays set with nothing pending: a waiting reader would spin"
                    await asyncio.sleep(0)
                    continue
                got.append(_seen(d))
                if d.finish_reason is not None:
                    return got

        task = asyncio.ensure_future(reader())
        for i in range(5):
            await asyncio.sleep(0.01)
            c.put(StreamDelta([i], str(i), "length" if i == 4 else None))
        return await task

    def target():
        try:
            box["out"] = call_with_time_limit(asyncio.run, main())
        except asyncio.TimeoutError:
            box["out"] = "the waiting reader was never woken: put() must set ready"
        except BaseException as exc:  # noqa: BLE001 - reported as the case's result
            box["out"] = f"raised {type(exc).__name__}: {exc}"

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(60)
    out = box.get("out", "did not finish in 60 s")
    return [tuple(x) for x in out] if isinstance(out, list) else out


def cases(seed: int = 0, n_random: int = 16) -> list[Case]:
    cs = [Case(name, _play(s), _describe(s)[:200]) for name, s in _SCRIPTS.items()]
    rng = random.Random(seed)
    for i in range(n_random):
        s = _random_script(rng)
        cs.append(Case(f"random script #{i}", _play(s), _describe(s)[:200]))
    cs.append(Case("a waiting reader wakes up", _wakes_the_reader,
                   "get() awaited in an event loop while five deltas are put, a few ms apart"))
    return cs


# --- classic mistakes -----------------------------------------------------------------------------
class _Base(RequestOutputCollector):
    pass


class _LatestWins(_Base):
    def put(self, item):
        self.output = item
        self.ready.set()


class _KeepsFirstFinish(_Base):
    def put(self, item):
        if self.output is None or isinstance(item, BaseException):
            self.output = item
            self.ready.set()
        elif isinstance(self.output, StreamDelta):
            self.output.token_ids.extend(item.token_ids)
            self.output.text += item.text


class _ReadyNeverCleared(_Base):
    def get_nowait(self):
        item, self.output = self.output, None
        if isinstance(item, BaseException):
            raise item
        return item


class _NotTaken(_Base):
    def get_nowait(self):
        item = self.output
        self.ready.clear()
        if isinstance(item, BaseException):
            raise item
        return item


class _ErrorWaitsItsTurn(_Base):
    def put(self, item):
        if self.output is None:
            self.output = item
            self.ready.set()
        elif isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            super().put(item)


class _DeltaAfterErrorWins(_Base):
    def put(self, item):
        if isinstance(self.output, BaseException) and isinstance(item, StreamDelta):
            self.output = item
            return
        super().put(item)


class _NewBeforeOld(_Base):
    def put(self, item):
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            self.output = StreamDelta(item.token_ids + self.output.token_ids, item.text + self.output.text,
                                      item.finish_reason)
        else:
            super().put(item)


class _ReadyNotSet(_Base):
    def put(self, item):
        super().put(item)
        self.ready.clear()


MISTAKES = [
    Mistake("the latest delta wins", "A reader that is behind must get every token: merge the new delta into the "
            "pending one (tokens and text appended), don't replace it — replacing drops the tokens it held.",
            _LatestWins),
    Mistake("the first finish reason is kept", "The newer delta's finish_reason is the request's state now: keep "
            "the first one (None) and the reader never learns that the stream ended — the client hangs.",
            _KeepsFirstFinish),
    Mistake("ready is never cleared", "get_nowait() must clear `ready` when it takes the delta: left set, the next "
            "get() finds it set with nothing pending and spins on the event loop instead of waiting.",
            _ReadyNeverCleared),
    Mistake("the delta is not taken", "get_nowait() must take the pending delta (set it back to None): left there, "
            "the next read returns its tokens again and the next put appends to them.", _NotTaken),
    Mistake("an error waits its turn", "An error must replace what is pending: when the engine loop dies, the "
            "reader must hear it at its next read, not get stale tokens and then wait forever.", _ErrorWaitsItsTurn),
    Mistake("a delta after an error replaces it", "Once an error is pending nothing after it matters: keep the "
            "error, don't let a later delta (or a merge) hide it.", _DeltaAfterErrorWins),
    Mistake("new text before old", "Merge in order: the pending delta's tokens and text come first, the new "
            "ones after them.", _NewBeforeOld),
    Mistake("ready is not set", "put() must set `ready` when something becomes pending: that is what wakes a "
            "reader waiting in get().", _ReadyNotSet),
    # (a put() that waits for the reader never returns: the time limit stops it, and the report says so)
]


def check_output_collector(cls: Any, quiet: bool = False) -> GradeResult:
    """Grade the learner's collector class (`put`, `get_nowait`, `ready`; `get` as given)."""
    if not isinstance(cls, type):
        raise TypeError(f"pass your collector class itself (e.g. OutputCollector), not {type(cls).__name__}")
    return grade("OutputCollector", cls, RequestOutputCollector, cases(), MISTAKES, quiet=quiet)


def slow_reader_demo(cls: Any, steps: int = 200, read_every: int = 25) -> dict:
    """An engine loop putting one token per step and a reader that reads every `read_every` steps:
    how many reads it took, how many tokens arrived, the most deltas ever pending at once."""
    c = cls()
    reads, tokens, text = 0, [], ""
    for step in range(steps):
        c.put(StreamDelta([step], chr(97 + step % 26), "length" if step == steps - 1 else None))
        if step % read_every == read_every - 1:
            d = c.get_nowait()
            reads += 1
            tokens += d.token_ids
            text += d.text
    return {"steps": steps, "reads": reads, "tokens_received": len(tokens), "in_order": tokens == list(range(steps))}
