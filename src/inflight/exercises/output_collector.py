"""Grader for chapter 9: the per-request output collector (`inflight.serve.output_collector`).

The learner writes `put(item)` and `get_nowait()` of a collector that holds one pending
`StreamDelta` (or an exception) and an `asyncio.Event` `ready` that is set exactly while something
is pending; `get()` (given) waits on `ready`. Each case plays a script of puts, reads and looks at
`ready` on fresh collectors and compares what the reader saw with the package's
`RequestOutputCollector`.

Every script is played twice: with the reader calling `get_nowait()` between the puts, and with
a reader already *waiting* in `get()` when the puts come (an event loop of its own, on a thread:
a notebook runs one already). The second is what the server does, and the only way to see a put
that forgets to wake the reader: a pending error that `get_nowait()` would raise at once never
reaches a reader that sleeps on `ready`. So every clause of the contract — keep, merge, an error
replaces, a delta after an error is dropped, take and clear — is graded with a reader waiting
and with none; and after each script, every delta the reader took must be as it was when taken.
"""
from __future__ import annotations

import asyncio
import inspect
import random
import threading
from typing import Any, Callable

from inflight.exercises.grading import Case, Diagnosis, GradeResult, call_with_time_limit, grade
from inflight.exercises.output_collector_mistakes import MISTAKES, SHARED_BY_ALL, SHARED_DELTA, Broken, beside
from inflight.serve.output_collector import RequestOutputCollector, StreamDelta

__all__ = ["check_output_collector", "cases", "MISTAKES", "Broken", "slow_reader_demo"]

YIELDS = 20  # event-loop turns a woken reader gets to take what is pending (it needs one or two)
_CHANGED = "a delta already read changed afterwards"
_REPLACED = ("ready is a new Event: the waiting reader still waits on the old one",)
_MIXED = ("this request got tokens put into the other request's collector",)


def _seen(item: Any) -> Any:
    """What a reader learns from one delta (type-strict: a StreamDelta with a list of ints, a str,
    a finish reason and an error; anything else is shown as what it is)."""
    if item is None:
        return ("nothing",)
    if inspect.iscoroutine(item):
        item.close()  # (never awaited: closed, so that Python does not warn about it on the page)
        return ("a coroutine, not a delta",)
    if type(item) is not StreamDelta:
        return ("not a StreamDelta", type(item).__name__)
    ids = item.token_ids
    if type(ids) is not list or not all(type(t) is int for t in ids) or type(item.text) is not str:
        return ("malformed", type(ids).__name__, type(item.text).__name__)
    return ("delta", list(ids), item.text, item.finish_reason, item.error)


def _target(op: str) -> tuple[str, int]:
    """"put@1" -> ("put", 1): the second request's collector (plain "put": the first's)."""
    name, _, which = op.partition("@")
    return name, int(which or 0)


def _put(c: Any, op: str, arg: list) -> Any:
    if op == "fail":
        returned = c.put(Broken(arg[0]))
    else:
        returned = c.put(StreamDelta(list(arg[0]), arg[1], *arg[2:]))
    if inspect.iscoroutine(returned):
        returned.close()
        return ("put returned a coroutine: nothing was put",)
    return None


def _ready(c: Any) -> tuple:
    ready = getattr(c, "ready", None)
    return ("ready", ready.is_set() if isinstance(ready, asyncio.Event) else "no asyncio.Event")


def _taken_unchanged(taken: list) -> list:
    """A delta the reader took is the reader's: anything done to it afterwards is a finding."""
    return [(_CHANGED, i) for i, (d, snap) in enumerate(taken)
            if isinstance(d, StreamDelta) and _seen(d) != snap]


def _foreign(script: list[tuple], i: int, seen: tuple) -> bool:
    """Whether a delta collector `i` gave holds a token that only the other collector was given."""
    mine = {t for op, *arg in script if _target(op) == ("put", i) for t in arg[0]}
    theirs = {t for op, *arg in script if _target(op) == ("put", 1 - i) for t in arg[0]}
    return seen[0] == "delta" and any(t in theirs and t not in mine for t in seen[1])


def _play(script: list[tuple]) -> Callable[[Any], list]:
    """The case without a waiting reader: each "get" is a `get_nowait()`."""
    def run(cls: Any) -> list:
        collectors, seen, taken = [cls(), cls()], [], []
        for op, *arg in script:
            name, i = _target(op)
            c = collectors[i]
            if name in ("put", "fail"):
                note = _put(c, name, arg)
                if note:
                    seen.append(note)
            elif name == "get":
                try:
                    item = c.get_nowait()
                except Broken as exc:
                    seen.append(("raised", str(exc)))
                    continue
                seen.append(_seen(item))
                taken.append((item, seen[-1]))
                if _foreign(script, i, seen[-1]):
                    seen.append(_MIXED)
            elif name == "ready":
                seen.append(_ready(c))
        return seen + _taken_unchanged(taken)
    return run


async def _read(c: Any) -> Any:
    """The given `get()`, step by step, with one guard: woken with nothing pending (ready left set)
    it would spin on the event loop forever; here it gives up after a while and says so."""
    spins = 0
    while getattr(c, "output", None) is None:
        if c.ready.is_set():
            spins += 1
            if spins > 100:
                return "spins"
            await asyncio.sleep(0)
            continue
        await c.ready.wait()
    return c.get_nowait()


def _waiting(script: list[tuple]) -> Callable[[Any], list]:
    """The case with a reader already waiting in `get()` on each collector: each "get" gives it a
    few turns of the event loop to wake and take what is pending; if it does not wake it has seen
    nothing (and keeps waiting)."""
    async def main(cls: Any) -> list:
        collectors, seen, taken = [cls(), cls()], [], []
        if not all(isinstance(getattr(c, "ready", None), asyncio.Event) for c in collectors):
            return [("no asyncio.Event",)]
        readers = [asyncio.ensure_future(_read(c)) for c in collectors]
        events = [c.ready for c in collectors]  # the Events the readers wait on
        await _turns(readers)
        try:
            for op, *arg in script:
                name, i = _target(op)
                c = collectors[i]
                if name in ("put", "fail"):
                    note = _put(c, name, arg)
                    if note:
                        seen.append(note)
                elif name == "ready":
                    seen.append(_ready(c))
                elif name == "get":
                    await _turns([readers[i]])
                    if not readers[i].done():
                        seen.append(_REPLACED if c.ready is not events[i] else ("nothing",))
                        continue
                    seen.append(_result(readers[i], taken))
                    if _foreign(script, i, seen[-1]):
                        seen.append(_MIXED)
                    readers[i], events[i] = asyncio.ensure_future(_read(c)), c.ready
                    await _turns([readers[i]])
        finally:
            for r in readers:
                r.cancel()
        return seen + _taken_unchanged(taken)

    def run(cls: Any) -> list:
        return _in_a_loop(main, cls)
    return run


async def _turns(tasks: list) -> None:
    for _ in range(YIELDS):
        if all(t.done() for t in tasks):
            return
        await asyncio.sleep(0)


def _result(reader: asyncio.Future, taken: list) -> tuple:
    exc = reader.exception()
    if isinstance(exc, Broken):
        return ("raised", str(exc))
    if exc is not None:
        raise exc
    item = reader.result()
    if item == "spins":
        return ("ready stays set with nothing pending: a waiting get() spins",)
    taken.append((item, _seen(item)))
    return taken[-1][1]


def _in_a_loop(main: Callable, cls: Any) -> Any:
    """`asyncio.run(main(cls))` on a thread of its own, under the grader's time limit; what it
    raised is raised here (a CodeTimeout too, so a put() that waits is reported as one)."""
    box: dict = {}

    def target():
        try:
            box["out"] = call_with_time_limit(asyncio.run, main(cls))
        except BaseException as exc:  # noqa: BLE001 - handed to the grader's thread
            box["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(60)
    if "exc" in box:
        raise box["exc"]
    return box.get("out", "did not finish in 60 s")


def _describe(script: list[tuple]) -> str:
    def one(op, *arg):
        name, i = _target(op)
        who = f"[request {i + 1}] " if any(_target(s[0])[1] for s in script) else ""
        if name == "put":
            return who + f"put({list(arg[0])}, {', '.join(map(repr, arg[1:]))})"
        return who + {"fail": f"put(error {arg[0]!r})" if arg else "", "get": "get", "ready": "ready?"}[name]
    return "; ".join(one(*s) for s in script)


_SCRIPTS = {
    "one delta, then nothing": [("ready",), ("put", [7], "a"), ("ready",), ("get",), ("ready",), ("get",)],
    "two deltas while the reader is away": [("put", [1], "a"), ("put", [2, 3], "bc"), ("ready",), ("get",), ("get",)],
    "the last delta ends it": [("put", [1], "a"), ("put", [2], "b"), ("put", [], "", "stop"), ("get",)],
    "read, then more": [("put", [1], "a"), ("get",), ("put", [2], "b"), ("put", [3], "c", "length"), ("get",),
                        ("ready",)],
    "a failure and its message": [("put", [1], "a"), ("put", [2], "b", "error", "the model raised"), ("get",)],
    "an ending is not undone": [("put", [1], "a", "length"), ("put", [], "", None), ("ready",), ("get",)],
    "an error replaces what is pending": [("put", [1], "a"), ("fail", "engine died"), ("ready",), ("get",),
                                          ("ready",), ("get",)],
    "an error with nothing pending": [("ready",), ("fail", "engine died"), ("ready",), ("get",), ("ready",)],
    "nothing after an error matters": [("fail", "engine died"), ("put", [4], "d"), ("get",), ("get",)],
    "two errors in a row": [("put", [1], "a"), ("fail", "first"), ("fail", "second"), ("get",), ("get",)],
    "a delta the reader took is the reader's": [("put", [1], "a"), ("get",), ("put", [2], "b"), ("put", [3], "c"),
                                                ("get",), ("put", [4], "d", "stop"), ("get",)],
    "two requests, two collectors": [("put", [1], "a"), ("put@1", [9], "z"), ("put", [2], "b"), ("get",),
                                     ("get@1",), ("put@1", [8], "y", "stop"), ("get@1",), ("get",)],
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
    """A reader waiting in an event loop while five deltas are put a few ms apart (real time, not
    turns of the loop): it must wake for them and get them all, the last one ending the stream."""
    async def main(cls: Any) -> list:
        c, got = cls(), []
        reader = asyncio.ensure_future(_read(c))
        for i in range(5):
            await asyncio.sleep(0.01)
            note = _put(c, "put", [[i], str(i), "length" if i == 4 else None])
            if note:
                return got + [note]
            await asyncio.sleep(0.01)
            if reader.done():
                got.append(_result(reader, []))
                if got[-1][0] != "delta" or got[-1][3] is not None:
                    return got
                reader = asyncio.ensure_future(_read(c))
        reader.cancel()
        return got + ["the waiting reader was never woken for the last delta"]

    return _in_a_loop(main, cls)


def cases(seed: int = 0, n_random: int = 10) -> list[Case]:
    rng = random.Random(seed)
    scripts = list(_SCRIPTS.items()) + [(f"random script #{i}", _random_script(rng)) for i in range(n_random)]
    out = [Case(name, _play(s), _describe(s)[:200]) for name, s in scripts]
    out += [Case(f"{name} (a reader waiting)", _waiting(s), "a reader already waiting in get(): " + _describe(s)[:170])
            for name, s in scripts]
    out.append(Case("a waiting reader wakes up", _wakes_the_reader,
                    "get() awaited in an event loop while five deltas are put, a few ms apart"))
    return out


def _structure(cls: Any, failures: list) -> Diagnosis | None:
    """An `async def put` (or get_nowait): the engine loop calls it without await, so it never runs.
    A delta that changed after the reader took it: merged into a delta that is shared."""
    for name in ("put", "get_nowait"):
        if inspect.iscoroutinefunction(getattr(cls, name, None)):
            return Diagnosis(f"{name}() is async", f"{name}() must be a plain `def`: the engine loop calls it "
                             "without `await` (it must never wait), so an `async def` only makes a coroutine "
                             "that never runs — nothing is ever put or taken.")
    for case, _, got in failures:
        if isinstance(got, list) and any(isinstance(x, tuple) and x[:1] == (_CHANGED,) for x in got):
            return Diagnosis(*SHARED_DELTA, case)
        if isinstance(got, list) and _MIXED in got:
            return Diagnosis(*SHARED_BY_ALL, case)
        if isinstance(got, list) and _REPLACED in got:
            return Diagnosis("a new Event for ready", "Set and clear the one Event the collector was made with: a "
                             "reader waiting in get() waits on that object, and it never hears of a new one.", case)
    return None


def check_output_collector(cls: Any, quiet: bool = False) -> GradeResult:
    """Grade the learner's collector class (`put`, `get_nowait`, `ready`; `get` as given)."""
    if not isinstance(cls, type):
        raise TypeError(f"pass your collector class itself (e.g. OutputCollector), not {type(cls).__name__}")
    return grade("OutputCollector", cls, RequestOutputCollector, cases(), MISTAKES + beside(cls), quiet=quiet,
                 diagnose=_structure)


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
