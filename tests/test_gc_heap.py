"""The startup heap frozen (`inflight.engine.gc_heap`) in the processes the package owns, never by
`LLMEngine` itself: the collector's full passes skip it, what comes after is collected as before, and a
dropped engine frees itself without the collector."""
from __future__ import annotations

import gc
import weakref

import pytest

from inflight.engine.gc_heap import freeze_gc_heap
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams


@pytest.fixture(autouse=True)
def _unfrozen_after():
    """What a test here freezes goes back to the collector: the rest of the session is not this module's."""
    yield
    gc.unfreeze()


class _Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it


def test_building_an_engine_leaves_the_callers_heap_alone(model):
    """A library call must not freeze its caller's heap: an object of the caller's alive in a cycle
    at that moment (here one holding an earlier engine) would never be collected."""
    gc.unfreeze()

    class Session:  # a notebook's object that refers to itself, holding an engine
        def __init__(self, engine):
            self.engine, self.me = engine, self

    s = Session(LLMEngine(model, num_blocks=16, block_size=4))
    kv = weakref.ref(s.engine.kv_cache)
    LLMEngine(model, num_blocks=16, block_size=4)
    assert gc.get_freeze_count() == 0
    del s
    gc.collect()
    assert kv() is None


def test_garbage_is_collected_before_the_freeze_and_after_it():
    gc.unfreeze()
    before = weakref.ref(_Node())  # garbage already: the freeze must not keep it
    freeze_gc_heap()
    assert before() is None
    after = weakref.ref(_Node())   # made after the freeze: collected as usual
    gc.collect()
    assert after() is None


def test_a_dropped_engine_frees_itself_without_the_collector(model):
    """Frozen objects are never walked again, so an engine caught in a freeze (a server's, a
    benchmark's) must be freed by reference counting alone: no cycles through it."""
    engine = LLMEngine(model, num_blocks=16, block_size=4)
    engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3))
    freeze_gc_heap()
    refs = [weakref.ref(x) for x in (engine, engine.scheduler, engine.runner, engine.kv_cache)]
    gc.disable()
    try:
        del engine
        assert [r() for r in refs] == [None] * len(refs)
    finally:
        gc.enable()


def test_the_freeze_can_be_turned_off_and_the_bench_counts_the_passes(monkeypatch):
    from inflight.bench.profiling import GcPauses

    gc.unfreeze()
    monkeypatch.setenv("INFLIGHT_GC_FREEZE", "0")
    freeze_gc_heap()
    assert gc.get_freeze_count() == 0
    with GcPauses() as p:
        gc.collect(0)
        gc.collect()
    assert p.passes == 2 and p.full_passes == 1 and p.seconds >= p.full_seconds > 0
    assert p.as_dict()["full_passes"] == 1
    assert p._callback not in gc.callbacks
