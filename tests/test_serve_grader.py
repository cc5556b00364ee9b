"""Chapter 9's grader (the output collector): it accepts the reference and an equivalent rewrite,
reports a stub as not implemented, stops a put() that waits for the reader, and rejects wrong
collectors written here independently of the package's mistakes — naming the mistake where one fits."""
from __future__ import annotations

import asyncio

import pytest

from inflight.exercises.output_collector import check_output_collector, slow_reader_demo
from inflight.serve.output_collector import RequestOutputCollector, StreamDelta


class Reference(RequestOutputCollector):
    pass


class Rewrite:
    """Same contract, different code: deltas kept in a list and joined when read."""

    def __init__(self):
        self.parts, self.error = [], None
        self.ready = asyncio.Event()

    @property
    def output(self):
        return self.error or (self.parts or None)

    def put(self, item):
        if self.error is not None:
            return
        if isinstance(item, BaseException):
            self.error, self.parts = item, []
        else:
            self.parts.append(item)
        self.ready.set()

    def get_nowait(self):
        parts, error = self.parts, self.error
        self.parts, self.error = [], None
        self.ready.clear()
        if error is not None:
            raise error
        if not parts:
            return None
        ends = [p for p in parts if p.finish_reason is not None]  # (the newest ending, with its message)
        return StreamDelta([t for p in parts for t in p.token_ids], "".join(p.text for p in parts),
                           ends[-1].finish_reason if ends else None, ends[-1].error if ends else None)

    async def get(self):
        while self.output is None:
            await self.ready.wait()
        return self.get_nowait()


def test_reference_and_an_equivalent_rewrite_pass():
    assert check_output_collector(Reference, quiet=True)
    assert check_output_collector(Rewrite, quiet=True)


def test_a_stub_is_not_implemented():
    class Stub(Reference):
        def put(self, item):
            raise NotImplementedError

    res = check_output_collector(Stub, quiet=True)
    assert not res and res.not_implemented


def test_passing_an_instance_is_a_clear_error():
    with pytest.raises(TypeError, match="collector class itself"):
        check_output_collector(Reference())


# --- wrong collectors, written independently -------------------------------------------------------
class DropsOld(Reference):  # "newest wins": a slow reader loses tokens
    def put(self, item):
        self.output = item
        self.ready.set()


class NeverEnds(Reference):  # merges tokens and text, forgets to carry the finish reason over
    def put(self, item):
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            self.output = StreamDelta(self.output.token_ids + item.token_ids, self.output.text + item.text,
                                      self.output.finish_reason)
        else:
            super().put(item)


class ForgetsToClear(Reference):
    def get_nowait(self):
        out = self.output
        self.output = None
        if isinstance(out, BaseException):
            raise out
        return out


class ReturnsTuple(Reference):  # type-strict: a tuple is not the StreamDelta the server writes out
    def get_nowait(self):
        d = super().get_nowait()
        return None if d is None else (d.token_ids, d.text, d.finish_reason)


class QueuesErrorsLast(Reference):  # an error goes behind the pending tokens
    def put(self, item):
        if isinstance(item, BaseException) and isinstance(self.output, StreamDelta):
            self._error = item
            return
        super().put(item)


class Blocks(Reference):  # one slot, and put waits for the reader to empty it
    def put(self, item):
        import time

        while self.output is not None:
            time.sleep(0.01)
        super().put(item)


@pytest.mark.parametrize("cls, mistake", [
    (DropsOld, "the latest delta wins"),
    (NeverEnds, "the first finish reason is kept"),
    (ForgetsToClear, "ready is never cleared"),
    (QueuesErrorsLast, "an error waits its turn"),
    (ReturnsTuple, None),
])
def test_wrong_collectors_fail_with_the_right_explanation(cls, mistake):
    res = check_output_collector(cls, quiet=True)
    assert not res and res.n_passed < res.n_total
    assert res.mistake == mistake, res.report


def test_a_put_that_waits_for_the_reader_is_stopped(monkeypatch):
    import inflight.exercises.grading as grading

    monkeypatch.setattr(grading, "TIME_LIMIT_S", 2.0)
    res = check_output_collector(Blocks, quiet=True)
    assert not res and res.timed_out and "did not return" in res.report


def test_slow_reader_demo_gets_every_token_in_a_few_reads():
    demo = slow_reader_demo(RequestOutputCollector, steps=100, read_every=10)
    assert demo == {"steps": 100, "reads": 10, "tokens_received": 100, "in_order": True}


# --- the mistakes of the held-out review (issue 30): each written as a learner would ------------------
class SilentError(Reference):  # an exception put without setting ready: a waiting reader never hears it
    def put(self, item):
        if isinstance(self.output, BaseException):
            return
        if isinstance(item, BaseException):
            self.output = item
        elif self.output is None:
            self.output = item
            self.ready.set()
        elif isinstance(self.output, StreamDelta):
            self.output = StreamDelta(self.output.token_ids + item.token_ids, self.output.text + item.text,
                                      item.finish_reason or self.output.finish_reason,
                                      item.error if item.finish_reason else self.output.error)


class AsyncPut(Reference):
    async def put(self, item):
        super().put(item)


class HandsBackTheError(Reference):
    def get_nowait(self):
        out = self.output
        self.output = None
        self.ready.clear()
        return out


class OneBuffer(Reference):  # merges every delta into one buffer it also hands to the reader
    def __init__(self):
        super().__init__()
        self.buffer = StreamDelta()

    def put(self, item):
        if isinstance(item, BaseException) or isinstance(self.output, BaseException):
            return super().put(item)
        self.buffer.token_ids += item.token_ids
        self.buffer.text += item.text
        if item.finish_reason:
            self.buffer.finish_reason, self.buffer.error = item.finish_reason, item.error
        self.output = self.buffer
        self.ready.set()


PENDING = StreamDelta()


class ModuleLevelDelta(Reference):  # every collector merges into the same module-level delta
    def put(self, item):
        if isinstance(item, BaseException) or isinstance(self.output, BaseException):
            return super().put(item)
        if self.output is None:
            PENDING.token_ids, PENDING.text, PENDING.finish_reason, PENDING.error = [], "", None, None
        PENDING.token_ids.extend(item.token_ids)
        PENDING.text += item.text
        PENDING.finish_reason = item.finish_reason or PENDING.finish_reason
        PENDING.error = item.error or PENDING.error
        self.output = PENDING
        self.ready.set()


class KeepsNewIds(Reference):  # text merged, token ids replaced
    def put(self, item):
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            ids = list(item.token_ids)
            super().put(item)
            self.output.token_ids = ids
        else:
            super().put(item)


class NoneOverwrites(Reference):  # the pre-issue-30 reading: the newer finish_reason always wins
    def put(self, item):
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            self.output.token_ids.extend(item.token_ids)
            self.output.text += item.text
            self.output.finish_reason, self.output.error = item.finish_reason, item.error
        else:
            super().put(item)


class ForgetsWhy(Reference):
    def put(self, item):
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            self.output.token_ids += item.token_ids
            self.output.text += item.text
            if item.finish_reason is not None:
                self.output.finish_reason = item.finish_reason
        else:
            super().put(item)


class NewestError(Reference):
    def put(self, item):
        if isinstance(item, BaseException):
            self.output = item
            self.ready.set()
        else:
            super().put(item)


@pytest.mark.parametrize("cls, mistake", [
    (SilentError, "an error does not wake the reader"),
    (AsyncPut, "put() is async"),
    (HandsBackTheError, "the error is returned, not raised"),
    (OneBuffer, "merging into a shared delta"),
    (ModuleLevelDelta, "merging into a shared delta"),
    (KeepsNewIds, "only the newest token_ids are kept"),
    (NoneOverwrites, "a later None undoes the end"),
    (ForgetsWhy, "the failure message is dropped"),
    (NewestError, "a second error replaces the first"),
])
def test_the_reviews_mistakes_are_failed_and_named(cls, mistake):
    res = check_output_collector(cls, quiet=True)
    assert not res and res.mistake == mistake, res.report
    assert "ready is never cleared" not in res.report or mistake == "ready is never cleared"


class FreshEvent(Reference):  # "sets" ready by making a new, set Event: a waiting reader waits on the old one
    def put(self, item):
        if isinstance(self.output, BaseException):
            return
        if self.output is None or isinstance(item, BaseException):
            self.output = item
            self.ready = asyncio.Event()
            self.ready.set()
        else:
            self.output.token_ids += item.token_ids
            self.output.text += item.text
            if item.finish_reason:
                self.output.finish_reason, self.output.error = item.finish_reason, item.error


class SharedIds(Reference):  # the token ids live in a class attribute: every collector appends to one list
    ids: list = []

    def put(self, item):
        if isinstance(item, BaseException) or isinstance(self.output, BaseException):
            return super().put(item)
        if self.output is None:
            type(self).ids = []
        type(self).ids += item.token_ids
        text = (self.output.text if self.output else "") + item.text
        ended = item if item.finish_reason else (self.output or item)
        self.output = StreamDelta(list(type(self).ids), text, ended.finish_reason, ended.error)
        self.ready.set()


def test_a_put_that_wakes_no_waiting_reader_fails_only_with_a_reader_waiting():
    """The false accept closed as a class: every case passes with get_nowait() (and `ready` reads
    set), and the same scripts fail with a reader waiting in get()."""
    res = check_output_collector(FreshEvent, quiet=True)
    assert not res and res.failed_case.endswith("(a reader waiting)"), res.report
    assert res.mistake == "a new Event for ready", res.report


def test_ids_shared_between_collectors_are_named():
    res = check_output_collector(SharedIds, quiet=True)
    assert not res and res.failed_case.startswith("two requests"), res.report
    assert res.mistake == "one delta shared by every collector", res.report


def test_async_put_leaves_no_never_awaited_warning(recwarn):
    check_output_collector(AsyncPut, quiet=True)
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
