"""The engine freezes its startup heap (`inflight.engine.gc_heap`): the collector's full passes skip it,
what comes after is collected as before, and a dropped engine still frees itself."""
from __future__ import annotations

import gc
import weakref

from inflight.engine.gc_heap import freeze_gc_heap
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams


class _Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it


def test_building_an_engine_freezes_what_is_alive(model):
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    engine = LLMEngine(model, num_blocks=16, block_size=4)
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(engine.scheduler)
    assert not any(o is engine.scheduler for o in gc.get_objects())  # frozen: no pass walks it


def test_garbage_is_collected_before_the_freeze_and_after_it():
    gc.unfreeze()
    before = weakref.ref(_Node())  # garbage already: the freeze must not keep it
    freeze_gc_heap()
    assert before() is None
    after = weakref.ref(_Node())   # made after the freeze: collected as usual
    gc.collect()
    assert after() is None


def test_a_dropped_engine_frees_itself_without_the_collector(model):
    """Frozen objects are never walked again, so an engine caught in a freeze (its own or a later
    engine's) must be freed by reference counting alone: no cycles through it."""
    engine = LLMEngine(model, num_blocks=16, block_size=4)
    engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3))
    LLMEngine(model, num_blocks=16, block_size=4)  # another one freezes the first, as a notebook would
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
