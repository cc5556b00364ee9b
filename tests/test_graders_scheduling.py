"""The scheduling graders accept the reference and catch wrong schedulers with the right explanation.

The mutants below are written here on purpose, independently of the package's `Mistake`s, the way
a learner might write them (different state layout, different control flow).
"""
import pytest

from inflight import ContinuousBatchScheduler, StaticBatchScheduler
from inflight.exercises.scheduling import (check_continuous_scheduler, check_memory_scheduler,
                                           check_static_scheduler)


class Learner:
    """A learner-style skeleton: a list of [id, remaining, cost] as the queue, a dict as the batch."""

    def __init__(self, max_batch_size, max_memory=None):
        self.max_batch_size = max_batch_size
        self.max_memory = max_memory
        self.queue = []
        self.running = {}

    def add_request(self, request_id, num_tokens, memory_cost=1):
        self.queue.append([request_id, num_tokens, memory_cost])

    def tick(self):
        ids = sorted(self.running)
        for rid in ids:
            self.running[rid][0] -= 1
        self.running = {k: v for k, v in self.running.items() if v[0] > 0}
        return ids

    def memory(self):
        return sum(v[1] for v in self.running.values())


# --- continuous mutants -------------------------------------------------------------------------------------
class ContAdmitLate(Learner):  # processes first, admits at the end
    def step(self):
        ids = self.tick()
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return ids


class ContSameStepReuse(Learner):  # retires finished requests and refills before counting the step
    def step(self):
        seen = []
        for _ in range(2):
            while self.queue and len(self.running) < self.max_batch_size:
                rid, n, c = self.queue.pop(0)
                self.running[rid] = [n, c]
            for rid in list(self.running):
                if rid in seen:
                    continue
                seen.append(rid)
                self.running[rid][0] -= 1
                if self.running[rid][0] == 0:
                    del self.running[rid]
        return sorted(seen)


class ContUnsorted(Learner):
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        ids = [rid for rid in self.running]
        self.tick()
        return ids


class ContDrainFirst(Learner):  # only refills an empty batch
    def step(self):
        if len(self.running) == 0:
            for rid, n, c in self.queue[: self.max_batch_size]:
                self.running[rid] = [n, c]
            self.queue = self.queue[self.max_batch_size:]
        return self.tick()


class ContStack(Learner):  # takes from the back of the queue
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue.pop()
            self.running[rid] = [n, c]
        return self.tick()


class ContReturnsSurvivors(Learner):
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        self.tick()
        return sorted(self.running)


class LateTick(Learner):  # drops a request when it is already at 0, i.e. one step after its last token
    def tick(self):
        ids = sorted(self.running)
        for rid in ids:
            if self.running[rid][0] == 0:
                del self.running[rid]
            else:
                self.running[rid][0] -= 1
        return ids


class ContLateRetire(LateTick):
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


class ContExtraSlot(Learner):
    def step(self):
        while self.queue and len(self.running) <= self.max_batch_size:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


CONTINUOUS_MUTANTS = [
    (ContAdmitLate, "admit after processing"),
    (ContSameStepReuse, "slot reused within the step"),
    (ContUnsorted, "unsorted ids"),
    (ContDrainFirst, "no immediate refill"),
    (ContStack, "LIFO admission"),
    (ContReturnsSurvivors, "finished requests not reported"),
    (ContLateRetire, "one token too many"),
    (ContExtraSlot, "one slot too many"),
]


# --- static mutants --------------------------------------------------------------------------------------------
class StaticRefillsEarly(Learner):
    def step(self):
        free = self.max_batch_size - len(self.running)
        for rid, n, c in self.queue[:free]:
            self.running[rid] = [n, c]
        del self.queue[:free]
        return self.tick()


class StaticLateBatch(Learner):
    def step(self):
        ids = self.tick()
        if not self.running:
            batch, self.queue = self.queue[: self.max_batch_size], self.queue[self.max_batch_size:]
            self.running = {rid: [n, c] for rid, n, c in batch}
        return ids


class StaticNeedsFullBatch(Learner):
    def step(self):
        if not self.running and len(self.queue) >= self.max_batch_size:
            batch, self.queue = self.queue[: self.max_batch_size], self.queue[self.max_batch_size:]
            self.running = {rid: [n, c] for rid, n, c in batch}
        return self.tick()


class StaticSingleton(Learner):
    def step(self):
        if not self.running and self.queue:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


class StaticInsertionOrder(Learner):
    def step(self):
        if not self.running:
            batch, self.queue = self.queue[: self.max_batch_size], self.queue[self.max_batch_size:]
            self.running = {rid: [n, c] for rid, n, c in batch}
        order = list(self.running.keys())
        self.tick()
        return order


class StaticSurvivors(Learner):
    def step(self):
        if not self.running:
            batch, self.queue = self.queue[: self.max_batch_size], self.queue[self.max_batch_size:]
            self.running = {rid: [n, c] for rid, n, c in batch}
        self.tick()
        return sorted(self.running)


class StaticLateRetire(LateTick):
    def step(self):
        if not self.running:
            while self.queue and len(self.running) < self.max_batch_size:
                rid, n, c = self.queue.pop(0)
                self.running[rid] = [n, c]
        return self.tick()


class StaticNewestFirst(Learner):
    def step(self):
        if not self.running:
            for _ in range(min(self.max_batch_size, len(self.queue))):
                rid, n, c = self.queue.pop()
                self.running[rid] = [n, c]
        return self.tick()


STATIC_MUTANTS = [
    (StaticRefillsEarly, "refills before the batch drains"),
    (StaticLateBatch, "new batch not processed in its first step"),
    (StaticNeedsFullBatch, "waits for a full batch"),
    (StaticSingleton, "one request per batch"),
    (StaticInsertionOrder, "unsorted ids"),
    (StaticSurvivors, "finished requests not reported"),
    (StaticLateRetire, "one token too many"),
    (StaticNewestFirst, "LIFO admission"),
]


# --- memory mutants -------------------------------------------------------------------------------------------
class MemFirstFit(Learner):  # looks past a head that doesn't fit
    def step(self):
        i = 0
        while i < len(self.queue) and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue[i]
            if self.max_memory is None or self.memory() + c <= self.max_memory:
                self.running[rid] = [n, c]
                self.queue.pop(i)
            else:
                i += 1
        return self.tick()


class MemOvershoot(Learner):  # admits, then notices it's over budget, but keeps the request
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            if self.max_memory is not None and self.memory() > self.max_memory:
                break
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
            if self.max_memory is not None and self.memory() > self.max_memory:
                break
        return self.tick()


class MemLeak(Learner):
    def __init__(self, max_batch_size, max_memory=None):
        super().__init__(max_batch_size, max_memory)
        self.allocated = 0

    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue[0]
            if self.max_memory is not None and self.allocated + c > self.max_memory:
                break
            self.queue.pop(0)
            self.running[rid] = [n, c]
            self.allocated += c
        return self.tick()


class MemNoneIsZero(Learner):
    def step(self):
        limit = self.max_memory if self.max_memory else 0
        while self.queue and len(self.running) < self.max_batch_size and self.memory() + self.queue[0][2] <= limit:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


class MemSlotsOnly(Learner):
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


class MemStrictLess(Learner):
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            cost = self.queue[0][2]
            if self.max_memory is not None and not self.memory() + cost < self.max_memory:
                break
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


class MemStopsWhenFull(Learner):  # admits while any memory is left, whatever the newcomer costs
    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            if self.max_memory is not None and self.memory() >= self.max_memory:
                break
            rid, n, c = self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


MEMORY_MUTANTS = [
    (MemFirstFit, "skipping ahead"),
    (MemOvershoot, "memory checked after admission"),
    (MemLeak, "memory never released"),
    (MemNoneIsZero, "max_memory=None treated as zero"),
    (MemSlotsOnly, "memory ignored"),
    (MemStrictLess, "exact fit rejected"),
    (MemStopsWhenFull, "budget checked without the newcomer's cost"),
]


class RightLearner(Learner):
    """A correct learner solution in the skeleton's style (passes all three graders' contracts)."""

    def step(self):
        while self.queue and len(self.running) < self.max_batch_size:
            rid, n, c = self.queue[0]
            if self.max_memory is not None and self.memory() + c > self.max_memory:
                break
            self.queue.pop(0)
            self.running[rid] = [n, c]
        return self.tick()


class Stub:
    def __init__(self, max_batch_size, max_memory=None):
        pass

    def add_request(self, request_id, num_tokens, memory_cost=1):
        pass

    def step(self):
        raise NotImplementedError("Your turn")


GRADERS = [
    (check_static_scheduler, StaticBatchScheduler, STATIC_MUTANTS),
    (check_continuous_scheduler, ContinuousBatchScheduler, CONTINUOUS_MUTANTS),
    (check_memory_scheduler, ContinuousBatchScheduler, MEMORY_MUTANTS),
]


@pytest.mark.parametrize("check,ref,_", GRADERS, ids=lambda x: getattr(x, "__name__", ""))
def test_reference_passes(check, ref, _, capsys):
    result = check(ref)
    assert result and result.n_passed == result.n_total >= 30
    assert "all" in capsys.readouterr().out


def test_learner_style_solutions_pass():
    assert check_continuous_scheduler(RightLearner, quiet=True)
    assert check_memory_scheduler(RightLearner, quiet=True)


@pytest.mark.parametrize("check,mutant,name", [(g[0], m, n) for g in GRADERS for m, n in g[2]],
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_mutant_rejected_with_the_right_explanation(check, mutant, name, capsys):
    result = check(mutant)
    assert not result
    assert result.mistake == name, f"{mutant.__name__}: recognised as {result.mistake!r}, expected {name!r}"
    assert result.report.count("💡") == 1 and "🤔" not in result.report
    out = capsys.readouterr().out
    assert "expected:" in out and "got:" in out and name in out


@pytest.mark.parametrize("check", [g[0] for g in GRADERS])
def test_not_implemented(check, capsys):
    result = check(Stub)
    assert not result and result.not_implemented
    assert "not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize("check", [g[0] for g in GRADERS])
def test_a_crashing_scheduler_fails_without_raising(check):
    class Crashes(Learner):
        def step(self):
            raise KeyError("oops")

    result = check(Crashes, quiet=True)
    assert not result and not result.not_implemented and "KeyError" in repr(result.got)
