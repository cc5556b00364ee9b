"""The classic wrong schedulers of chapters 2-3, written as code, so a grader can recognise a learner's
scheduler by behaving like one of them (see `inflight.exercises.grading`). Chapter 4's memory-aware
ones are in `scheduling_memory_mistakes`."""
from __future__ import annotations

from collections import deque

from inflight.exercises.grading import Mistake

__all__ = ["CONTINUOUS_MISTAKES", "STATIC_MISTAKES"]


class _Sketch:
    """Minimal state shared by the mistakes: a FIFO of [id, remaining, cost] and an active dict."""

    def __init__(self, max_batch_size: int, max_memory: float | None = None):
        self.max_batch_size, self.max_memory = max_batch_size, max_memory
        self.waiting: deque = deque()
        self.active: dict = {}  # id -> [remaining, cost]

    def add_request(self, request_id, num_tokens, memory_cost=1):
        self.waiting.append((request_id, num_tokens, memory_cost))

    def _take(self):
        rid, n, c = self.waiting.popleft()
        self.active[rid] = [n, c]

    def _process(self) -> list:
        done = sorted(self.active)
        for rid in done:
            self.active[rid][0] -= 1
            if self.active[rid][0] == 0:
                del self.active[rid]
        return done

    def _fill(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            self._take()


class _AdmitAfterProcessing(_Sketch):
    def step(self):
        done = self._process()
        self._fill()
        return done


class _AdmitIntoFreedSlot(_Sketch):
    def step(self):
        self._fill()
        done = self._process()
        self._fill()  # a slot freed this step is reused in this same step
        extra = [rid for rid in self.active if rid not in done]
        for rid in extra:
            self.active[rid][0] -= 1
            if self.active[rid][0] == 0:
                del self.active[rid]
        return sorted(done + extra)


class _Unsorted(_Sketch):
    def step(self):
        self._fill()
        done = list(self.active)  # admission order, not sorted
        self._process()
        return done


class _NoImmediateRefill(_Sketch):
    def step(self):
        if not self.active:
            self._fill()
        return self._process()


class _Lifo(_Sketch):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n, c = self.waiting.pop()
            self.active[rid] = [n, c]
        return self._process()


class _RetireOneStepLate(_Sketch):
    """Checks for 0 before decrementing, so every request gets one token more than it asked for."""

    def _process(self) -> list:
        done = sorted(self.active)
        for rid in done:
            if self.active[rid][0] == 0:
                del self.active[rid]
            else:
                self.active[rid][0] -= 1
        return done

    def step(self):
        self._fill()
        return self._process()


class _OneSlotTooMany(_Sketch):
    def step(self):
        while self.waiting and len(self.active) <= self.max_batch_size:  # <= lets one more in
            self._take()
        return self._process()


class _ReportAfterRemoval(_Sketch):
    def step(self):
        self._fill()
        self._process()
        return sorted(self.active)


class _ReportsFinished(_Sketch):
    def step(self):
        self._fill()
        before = set(self.active)
        self._process()
        return sorted(before - set(self.active))  # only the ids that finished this step


class _OneAdmissionPerStep(_Sketch):
    def step(self):
        if self.waiting and len(self.active) < self.max_batch_size:  # an `if` where a `while` belongs
            self._take()
        return self._process()


class _NoBatchLimit(_Sketch):
    def step(self):
        while self.waiting:
            self._take()
        return self._process()


class _ContinuousRight(_Sketch):  # used as a building block of some static mistakes
    def step(self):
        self._fill()
        return self._process()


class _StaticAdmitNextStep(_Sketch):
    def step(self):
        done = self._process()
        if not self.active:
            self._fill()
        return done


class _StaticWaitsForFullBatch(_Sketch):
    def step(self):
        if not self.active and len(self.waiting) >= self.max_batch_size:
            self._fill()
        return self._process()


class _StaticOnePerBatch(_Sketch):
    def step(self):
        if not self.active and self.waiting:
            self._take()
        return self._process()


class _StaticRetireOneStepLate(_RetireOneStepLate):
    def step(self):
        if not self.active:
            self._fill()
        return self._process()


class _StaticReportsFinished(_Sketch):
    def step(self):
        if not self.active:
            self._fill()
        before = set(self.active)
        self._process()
        return sorted(before - set(self.active))


class _StaticOneSlotTooMany(_Sketch):
    def step(self):
        if not self.active:
            while self.waiting and len(self.active) <= self.max_batch_size:
                self._take()
        return self._process()


class _StaticNoBatchLimit(_Sketch):
    def step(self):
        if not self.active:
            while self.waiting:
                self._take()
        return self._process()


class _StaticLifo(_Sketch):
    def step(self):
        if not self.active:
            while self.waiting and len(self.active) < self.max_batch_size:
                rid, n, c = self.waiting.pop()
                self.active[rid] = [n, c]
        return self._process()


class _StaticUnsorted(_Sketch):
    def step(self):
        if not self.active:
            self._fill()
        done = list(self.active)
        self._process()
        return done


class _StaticReportAfterRemoval(_Sketch):
    def step(self):
        if not self.active:
            self._fill()
        self._process()
        return sorted(self.active)


_FINISHED = Mistake(
    "finished ids instead of processed ones",
    "you return only the requests that finished in this step; step() returns every request that got a token "
    "in it — the whole batch, sorted — finished ones included.", _ReportsFinished)

CONTINUOUS_MISTAKES = [
    Mistake("admit after processing",
            "you admit waiting requests after the tokens of this step are processed, so a newly "
            "admitted request idles one step (the very first step returns []). Admit first, then process.",
            _AdmitAfterProcessing),
    Mistake("slot reused within the step",
            "a slot freed in this step is given to a waiting request in the same step, so one slot "
            "serves two requests at once; a finished request's slot is free only from the next step().",
            _AdmitIntoFreedSlot),
    Mistake("unsorted ids",
            "step() must return the processed ids sorted; yours come back in admission order.",
            _Unsorted),
    Mistake("no immediate refill",
            "you wait for the whole batch to drain before admitting anyone — that is static batching. "
            "Fill every free slot at the start of every step.",
            _NoImmediateRefill),
    Mistake("LIFO admission",
            "you admit the newest request first (a stack); the waiting queue is FIFO — popleft, not pop.",
            _Lifo),
    Mistake("finished requests not reported",
            "you return the ids still active after removal, so a request that finished this step is "
            "missing; return every id processed this step, finished ones included.",
            _ReportAfterRemoval),
    Mistake("one token too many",
            "you check for 0 before decrementing, so a request is dropped one step after its last "
            "token and gets num_tokens + 1 tokens; decrement first, then drop the requests at 0.",
            _RetireOneStepLate),
    Mistake("one slot too many",
            "your admission loop runs while len(active) <= max_batch_size, so the batch holds "
            "max_batch_size + 1 requests; admit only while len(active) < max_batch_size.",
            _OneSlotTooMany),
    _FINISHED,
    Mistake("one admission per step",
            "you admit at most one waiting request per step (an `if` where a `while` belongs), so free slots "
            "stay empty while requests wait; keep admitting while a slot is free and the queue is not empty.",
            _OneAdmissionPerStep),
    Mistake("no batch limit",
            "you admit every waiting request, so the batch grows past max_batch_size; stop admitting when "
            "len(active) reaches max_batch_size.", _NoBatchLimit),
]

STATIC_MISTAKES = [
    Mistake("refills before the batch drains",
            "you admit into a free slot while the batch is still running — that is continuous "
            "batching; a static scheduler admits a new batch only when every request has finished.",
            _ContinuousRight),
    Mistake("new batch not processed in its first step",
            "the new batch is admitted after processing, so every batch starts with an idle step "
            "(the first step returns []); admit first, then process in the same step.",
            _StaticAdmitNextStep),
    Mistake("waits for a full batch",
            "you only start a batch when max_batch_size requests are waiting, so a smaller final "
            "group (or a quiet period) never runs; take whatever is waiting, up to max_batch_size.",
            _StaticWaitsForFullBatch),
    Mistake("one request per batch",
            "you admit a single request when the batch is empty; fill the batch with up to "
            "max_batch_size waiting requests.",
            _StaticOnePerBatch),
    Mistake("unsorted ids",
            "step() must return the processed ids sorted; yours come back in admission order.",
            _StaticUnsorted),
    Mistake("finished requests not reported",
            "you return the ids still active after removal, so a request that finished this step is "
            "missing; return every id processed this step, finished ones included.",
            _StaticReportAfterRemoval),
    Mistake("one token too many",
            "you check for 0 before decrementing, so a request is dropped one step after its last "
            "token and gets num_tokens + 1 tokens; decrement first, then drop the requests at 0.",
            _StaticRetireOneStepLate),
    Mistake("LIFO admission",
            "you fill the batch with the newest requests first (a stack); the waiting queue is FIFO — "
            "popleft, not pop.",
            _StaticLifo),
    Mistake("finished ids instead of processed ones", _FINISHED.explanation, _StaticReportsFinished),
    Mistake("one slot too many",
            "your batch-filling loop runs while len(active) <= max_batch_size, so a batch holds max_batch_size + 1 "
            "requests; fill only while len(active) < max_batch_size.", _StaticOneSlotTooMany),
    Mistake("no batch limit",
            "you put every waiting request into the new batch; a batch holds at most max_batch_size requests, "
            "the rest wait for the next one.", _StaticNoBatchLimit),
]
