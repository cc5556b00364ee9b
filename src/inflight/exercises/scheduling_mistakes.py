"""The classic wrong schedulers of chapters 2-4, written as code, so a grader can recognise a learner's
scheduler by behaving like one of them (see `inflight.exercises.grading`)."""
from __future__ import annotations

from collections import deque

from inflight.exercises.grading import Mistake

__all__ = ["CONTINUOUS_MISTAKES", "STATIC_MISTAKES", "MEMORY_MISTAKES"]


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


class _MemUsed(_Sketch):
    def used(self):
        return sum(c for _, c in self.active.values())


class _SkipAhead(_MemUsed):
    def step(self):
        for item in list(self.waiting):
            if len(self.active) >= self.max_batch_size:
                break
            if self.max_memory is None or self.used() + item[2] <= self.max_memory:
                self.waiting.remove(item)
                self.active[item[0]] = [item[1], item[2]]
        return self._process()


class _CheckAfterAdmission(_MemUsed):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used() > self.max_memory:
                break
            self._take()  # the newcomer's own cost is never checked before it is in
        return self._process()


class _CheckedWithoutNewcomer(_MemUsed):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used() >= self.max_memory:
                break  # "stop when the budget is used up": the newcomer's own cost is never checked
            self._take()
        return self._process()


class _NeverRelease(_Sketch):
    def __init__(self, max_batch_size, max_memory=None):
        super().__init__(max_batch_size, max_memory)
        self.used = 0

    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used + self.waiting[0][2] > self.max_memory:
                break
            self.used += self.waiting[0][2]
            self._take()
        return self._process()  # finished requests never give their memory back


class _NoneAsZero(_MemUsed):
    def step(self):
        budget = self.max_memory or 0
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.used() + self.waiting[0][2] > budget:
                break
            self._take()
        return self._process()


class _IgnoresMemory(_ContinuousRight):
    pass


class _ExactFitRejected(_MemUsed):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used() + self.waiting[0][2] >= self.max_memory:
                break
            self._take()
        return self._process()


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
]

MEMORY_MISTAKES = [
    Mistake("skipping ahead",
            "when the front of the queue doesn't fit you admit a smaller request from further back; "
            "the spec is strict FIFO: stop admitting for this step.",
            _SkipAhead),
    Mistake("memory checked after admission",
            "you compare the memory already in use with the budget before adding the newcomer's own "
            "cost, so the admission that crosses the budget slips through; check used + memory_cost <= max_memory.",
            _CheckAfterAdmission),
    Mistake("budget checked without the newcomer's cost",
            "you stop admitting only once the memory in use has reached the budget, so a newcomer is let in "
            "whenever any room is left, however large its own cost; check used + memory_cost <= max_memory.",
            _CheckedWithoutNewcomer),
    Mistake("memory never released",
            "a finished request keeps its memory counted, so the budget shrinks until nothing fits; "
            "release a request's memory_cost when it finishes (or recompute it from the active set).",
            _NeverRelease),
    Mistake("max_memory=None treated as zero",
            "None means 'no memory limit', but you use it as a budget of 0, so nothing is ever "
            "admitted with the defaults; skip the memory check when max_memory is None.",
            _NoneAsZero),
    Mistake("memory ignored",
            "you only count slots; admission must also keep the total memory_cost of the active "
            "requests within max_memory.",
            _IgnoresMemory),
    Mistake("exact fit rejected",
            "a request that fills the budget exactly is allowed (used + cost <= max_memory); you use <.",
            _ExactFitRejected),
]
