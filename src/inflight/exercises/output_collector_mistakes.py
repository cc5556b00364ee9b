"""The classic wrong output collectors (chapter 9's exercise), each a small class the grader
compares the learner's with: one mistake each, in `put` or in `get_nowait`, with the sentence
that explains it. (Some are recognised otherwise, in `output_collector._structure`: an `async def
put`, by its form; a delta changed after the reader took it, tokens of another request, a new
Event for `ready`, by the cases' own findings.)"""
from __future__ import annotations

from typing import Any

from inflight.exercises.grading import Mistake
from inflight.serve.output_collector import RequestOutputCollector, StreamDelta

__all__ = ["MISTAKES", "Broken", "beside", "SHARED_DELTA", "SHARED_BY_ALL"]

#: the diagnosis of a delta that changed after the reader took it
SHARED_DELTA = ("merging into a shared delta", "Once get_nowait() has handed a delta to the reader it is the "
                "reader's: merge later deltas into a new pending one, never into one that is kept for the next "
                "merge, a class attribute or a module-level delta — the text the reader already holds would "
                "change under it, it would get those tokens again, and requests' tokens would mix.")
#: the diagnosis of a collector that handed out tokens put into another one
SHARED_BY_ALL = ("one delta shared by every collector", "Each request's collector holds its own pending delta: "
                 "state kept on the class (a class attribute) or in the module is shared by every collector, and "
                 "one request's tokens reach another's client.")


class Broken(RuntimeError):
    """The error the cases hand over (as the engine loop does when it dies)."""


class _Base(RequestOutputCollector):
    pass


def _merge(pending: StreamDelta, item: StreamDelta) -> None:
    pending.token_ids.extend(item.token_ids)
    pending.text += item.text
    if item.finish_reason is not None:
        pending.finish_reason, pending.error = item.finish_reason, item.error


class _LatestWins(_Base):
    def put(self, item):
        self.output = item
        self.ready.set()


class _KeepsFirstFinish(_Base):
    def put(self, item):
        if isinstance(self.output, BaseException):
            return
        if self.output is None or isinstance(item, BaseException):
            self.output = item
            self.ready.set()
        elif isinstance(self.output, StreamDelta):
            self.output.token_ids.extend(item.token_ids)
            self.output.text += item.text


class _NoneUndoesTheEnd(_Base):
    def put(self, item):
        if isinstance(self.output, BaseException):
            return
        if self.output is None or isinstance(item, BaseException):
            self.output = item
            self.ready.set()
        elif isinstance(self.output, StreamDelta):
            self.output.token_ids.extend(item.token_ids)
            self.output.text += item.text
            self.output.finish_reason, self.output.error = item.finish_reason, item.error


class _DropsTheMessage(_Base):
    def put(self, item):
        if isinstance(self.output, BaseException):
            return
        if self.output is None or isinstance(item, BaseException):
            self.output = item
            self.ready.set()
        elif isinstance(self.output, StreamDelta):
            self.output.token_ids.extend(item.token_ids)
            self.output.text += item.text
            self.output.finish_reason = item.finish_reason or self.output.finish_reason


class _NewestTokenIds(_Base):
    def put(self, item):
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            _merge(self.output, item)
            self.output.token_ids = list(item.token_ids)
        else:
            super().put(item)


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


class _ReturnsTheError(_Base):
    def get_nowait(self):
        item, self.output = self.output, None
        self.ready.clear()
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


class _LaterErrorReplaces(_Base):
    def put(self, item):
        if isinstance(self.output, BaseException) and isinstance(item, BaseException):
            self.output = item
            return
        super().put(item)


class _ErrorDoesNotWake(_Base):
    def put(self, item):
        if isinstance(item, BaseException) and not isinstance(self.output, BaseException):
            self.output = item
            return
        super().put(item)


class _NewBeforeOld(_Base):
    def put(self, item):
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            self.output = StreamDelta(item.token_ids + self.output.token_ids, item.text + self.output.text,
                                      item.finish_reason or self.output.finish_reason, item.error or self.output.error)
        else:
            super().put(item)


class _ReadyNotSet(_Base):
    def put(self, item):
        super().put(item)
        self.ready.clear()


def _m(name: str, explanation: str, impl: type) -> Mistake:
    return Mistake(name, explanation, impl)


MISTAKES = [
    _m("the latest delta wins", "A reader that is behind must get every token: merge the new delta into the pending "
       "one (tokens and text appended), don't replace it — replacing drops the tokens it held.", _LatestWins),
    _m("the first finish reason is kept", "A newer delta's finish_reason is the request's state now: keep the first "
       "one (None) and the reader never learns that the stream ended — the client hangs.", _KeepsFirstFinish),
    _m("a later None undoes the end", "Once a delta says the request ended, it has ended: a newer delta's "
       "finish_reason (and error) replace the pending ones only when it has one, never with None.", _NoneUndoesTheEnd),
    _m("the failure message is dropped", "A delta that ends with finish_reason \"error\" carries why in `error`: "
       "merge it with its finish reason (the server sends it to the client as the failure message).",
       _DropsTheMessage),
    _m("only the newest token_ids are kept", "Merge token_ids as you merge text: the server counts the tokens of "
       "every delta (usage, the metrics), so the pending token ids come first and the new ones after them.",
       _NewestTokenIds),
    _m("ready is never cleared", "get_nowait() must clear `ready` when it takes the delta: left set, the next get() "
       "finds it set with nothing pending and spins on the event loop instead of waiting.", _ReadyNeverCleared),
    _m("the delta is not taken", "get_nowait() must take the pending delta (set it back to None): left there, the "
       "next read returns its tokens again and the next put appends to them.", _NotTaken),
    _m("the error is returned, not raised", "get_nowait() must raise a pending exception: returned, the reader (the "
       "server's stream) takes it for a delta, instead of ending the stream with the error.", _ReturnsTheError),
    _m("an error waits its turn", "An error must replace what is pending: when the engine loop dies, the reader "
       "must hear it at its next read, not get stale tokens and then wait forever.", _ErrorWaitsItsTurn),
    _m("a delta after an error replaces it", "Once an error is pending nothing after it matters: keep the error, "
       "don't let a later delta (or a merge) hide it.", _DeltaAfterErrorWins),
    _m("a second error replaces the first", "Nothing after an error matters, a second error neither: keep the first "
       "(it is the cause; what fails after it is its consequence).", _LaterErrorReplaces),
    _m("an error does not wake the reader", "put() must set `ready` for an exception too: a reader already waiting "
       "in get() sleeps until `ready` is set, so an error put without it never reaches it (in the server, every "
       "waiting client would hang when the engine loop dies).", _ErrorDoesNotWake),
    _m("new text before old", "Merge in order: the pending delta's tokens and text come first, the new ones after "
       "them.", _NewBeforeOld),
    _m("ready is not set", "put() must set `ready` when something becomes pending: that is what wakes a reader "
       "waiting in get().", _ReadyNotSet),
    # (a put() that waits for the reader never returns: the time limit stops it, and the report says so)
]

_METHODS = ("put", "get_nowait")


def beside(cls: Any) -> list[Mistake]:
    """Each classic mistake lives in one of the two methods. A learner's put() may be right in another
    way than the reference's (setting `ready` on every call, merging into a new delta), and beside a
    wrong get_nowait() the two then behave unlike the mistake's sketch: so each get_nowait() mistake is
    also tried with the learner's own __init__ and put(). (put() mistakes keep the reference's
    get_nowait(): the contract leaves a right one no room to differ, and each extra mistake costs the
    waiting-reader case's time limit when the learner's put() is wrong too.)"""
    out = []
    for m in MISTAKES:
        wrong = [name for name in _METHODS if name in vars(m.impl)]
        if wrong != ["get_nowait"]:
            continue
        own = {name: getattr(cls, name) for name in ("__init__", *_METHODS)
               if name not in wrong and callable(getattr(cls, name, None))
               and getattr(cls, name) is not getattr(object, name, None)}
        if own:
            out.append(Mistake(m.name, m.explanation, type(f"{m.impl.__name__}Beside", (m.impl,), own)))
    return out
