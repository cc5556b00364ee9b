"""Graders stop code that never returns. In every grader family a deliberately endless loop — in
the learner's step(), allocate(), or plain function, on every case or only on some — is stopped at
the time limit and reported as "your ...() did not return within ... s", without running the
remaining cases; from the main thread and from a worker thread (signal.alarm could do neither on
Windows, nor the second anywhere)."""
from __future__ import annotations

import sys
import threading

import pytest

from inflight.exercises import grading
from inflight.exercises.batching import check_kv_bytes_per_token, kv_bytes_per_token
from inflight.exercises.engine_loop import check_engine_loop
from inflight.engine.block_manager import copy_on_write
from inflight.exercises.copy_on_write import check_copy_on_write
from inflight.exercises.paged import check_allocator, check_blocks_needed, check_slot_mapping
from inflight.exercises.paged_allocators import ReferenceAllocator
from inflight.exercises.scheduling import check_continuous_scheduler, check_memory_scheduler, check_static_scheduler
from inflight.exercises.serving import check_serving_metrics, serving_metrics
from inflight.exercises.sharing import check_choose_victim, check_prefix_hit, choose_victim, prefix_hit
from inflight.sim.schedulers import ContinuousBatchScheduler, StaticBatchScheduler


@pytest.fixture(autouse=True)
def short_limit(monkeypatch):
    monkeypatch.setattr(grading, "TIME_LIMIT_S", 0.3)


def spin():
    while True:  # no call inside: only a line-level check can stop this
        pass


class SpinningContinuous(ContinuousBatchScheduler):
    def step(self):
        while self._waiting:  # waits for the queue to drain, which only admission would do
            pass
        return super().step()


class SpinningStatic(StaticBatchScheduler):
    def step(self):
        spin()


class SpinningAllocator(ReferenceAllocator):
    def allocate(self, n):
        while n > self.num_free:  # "wait until blocks are free": nobody frees them meanwhile
            try:
                pass
            except Exception:  # an `except Exception` cannot swallow the grader's stop
                pass
        return super().allocate(n)


def spinning_step(engine):
    engine.reap()
    engine.budget()
    engine.admit()
    while engine.scheduler.waiting:  # wait for the queue to empty before decoding
        engine.preempt()
    engine.decode()


def slow_blocks_needed(n, bs):
    k = 0
    while k * bs < n or k < 0:
        k += 0 if n > 4000 else 1  # loops forever only on the big cases
    return k


GRADERS = [
    ("static scheduler", check_static_scheduler, SpinningStatic, "SpinningStatic.step()", "spin()"),
    ("continuous scheduler", check_continuous_scheduler, SpinningContinuous, "SpinningContinuous.step()", None),
    ("memory scheduler", check_memory_scheduler, SpinningContinuous, "SpinningContinuous.step()", None),
    ("blocks_needed", check_blocks_needed, slow_blocks_needed, "slow_blocks_needed()", None),  # (not on the first cases)
    ("slot_mapping", check_slot_mapping, lambda t, p, bs: spin(), "spin()", None),
    ("allocator", check_allocator, SpinningAllocator, "SpinningAllocator.allocate()", None),
    ("engine loop", check_engine_loop, spinning_step, "spinning_step()", None),
    ("serving metrics", check_serving_metrics, lambda timeline: spin(), "spin()", None),
    ("prefix hit", check_prefix_hit, lambda t, bs, keys: spin(), "spin()", None),
    ("choose victim", check_choose_victim, lambda running: spin(), "spin()", None),
    ("KV bytes", check_kv_bytes_per_token, lambda cfg, b: spin(), "spin()", None),
    ("copy on write", check_copy_on_write, lambda a, t, p: spin(), "spin()", None),
]


def _grade_in(where: str, check, impl):
    if where == "main thread":
        return check(impl, quiet=True)
    box = {}
    worker = threading.Thread(target=lambda: box.update(result=check(impl, quiet=True)), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the grader hung in a worker thread"
    return box["result"]


@pytest.mark.parametrize("where", ["main thread", "worker thread"])
@pytest.mark.parametrize("name, check, impl, culprit, inside", GRADERS, ids=[g[0] for g in GRADERS])
def test_endless_loops_are_stopped_and_named(name, check, impl, culprit, inside, where):
    tracer = sys.gettrace()
    result = _grade_in(where, check, impl)
    assert not result and result.timed_out
    assert f"your {culprit} did not return within 0.3 s" in result.report, result.report
    if inside:
        assert f"(stopped inside {inside})" in result.report
    assert "the rest were not run" in result.report
    assert sys.gettrace() is tracer  # a debugger's or coverage's tracer is back in place


@pytest.mark.parametrize("check, reference", [
    (check_continuous_scheduler, ContinuousBatchScheduler), (check_static_scheduler, StaticBatchScheduler),
    (check_allocator, ReferenceAllocator), (check_serving_metrics, serving_metrics),
    (check_prefix_hit, prefix_hit), (check_choose_victim, choose_victim),
    (check_kv_bytes_per_token, kv_bytes_per_token), (check_copy_on_write, copy_on_write),
])
def test_correct_answers_still_pass_under_the_limit(check, reference):
    # the package's own answers, as a learner would pass them (a subclass or a wrapper defined here)
    impl = type("Mine", (reference,), {}) if isinstance(reference, type) else (lambda *a: reference(*a))
    result = check(impl, quiet=True)
    assert result and not result.timed_out, result.report


def test_call_with_time_limit_returns_values_and_raises_what_the_code_raises():
    assert grading.call_with_time_limit(lambda x: x + 1, 1) == 2
    with pytest.raises(ZeroDivisionError):
        grading.call_with_time_limit(lambda: 1 / 0)
    with pytest.raises(grading.CodeTimeout, match="did not return within 0.05 s"):
        grading.call_with_time_limit(spin, seconds=0.05)
