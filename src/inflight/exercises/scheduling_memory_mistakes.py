"""The classic wrong memory-aware schedulers of chapter 4, written as code (see `scheduling_mistakes`)."""
from __future__ import annotations

from inflight.exercises.grading import Mistake
from inflight.exercises.scheduling_mistakes import _FINISHED, _ContinuousRight, _ReportsFinished, _Sketch

__all__ = ["MEMORY_MISTAKES"]


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


class _DefaultCostZero(_MemUsed):
    def add_request(self, request_id, num_tokens, memory_cost=0):  # the default should be 1
        self.waiting.append((request_id, num_tokens, memory_cost))

    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is not None and self.used() + self.waiting[0][2] > self.max_memory:
                break
            self._take()
        return self._process()


class _HugeAdmittedWhenIdle(_MemUsed):
    def step(self):
        while self.waiting and len(self.active) < self.max_batch_size:
            fits = self.max_memory is None or self.used() + self.waiting[0][2] <= self.max_memory
            if not fits and self.active:  # "let it run alone, or it would wait forever"
                break
            self._take()
            if not fits:
                break
        return self._process()


class _MemOneAdmissionPerStep(_MemUsed):
    def step(self):
        if self.waiting and len(self.active) < self.max_batch_size:
            if self.max_memory is None or self.used() + self.waiting[0][2] <= self.max_memory:
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
    Mistake("default memory_cost is not 1",
            "add_request's memory_cost defaults to 1 (the signature is add_request(request_id, num_tokens, "
            "memory_cost=1)); a request added without a cost still takes 1 of max_memory.", _DefaultCostZero),
    Mistake("over-budget request admitted when the batch is empty",
            "a request whose memory_cost exceeds max_memory must never be admitted, not even alone: the total "
            "memory of the active requests never exceeds max_memory. Under strict FIFO it blocks the queue "
            "(the text says so); a real server would refuse it at add_request.", _HugeAdmittedWhenIdle),
    Mistake("one admission per step",
            "you admit at most one waiting request per step (an `if` where a `while` belongs); keep admitting "
            "the head while a slot is free and its cost fits.", _MemOneAdmissionPerStep),
    Mistake("finished ids instead of processed ones", _FINISHED.explanation, _ReportsFinished),
]
