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
        return StreamDelta([t for p in parts for t in p.token_ids], "".join(p.text for p in parts),
                           parts[-1].finish_reason)

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
