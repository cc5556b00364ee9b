"""The engine's parts under fuzz, through their public APIs: both block allocators, the scheduler's
config, and Part I's schedulers. Any call with any arguments either works or raises a
ValueError/TypeError (NoFreeBlocksError when the pool is merely full right now) that names the
problem — and a call that raises changes nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from inflight.engine.block_manager import BlockAllocator, NoFreeBlocksError
from inflight.engine.prefix_cache import PrefixCachingBlockAllocator, block_key
from inflight.engine.scheduler import SchedulerConfig
from inflight.sim.schedulers import (ContinuousBatchScheduler, PriorityScheduler, SkipAheadScheduler,
                                     StaticBatchScheduler)

junk = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.just(10**400),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.binary(max_size=4),
                 st.sampled_from([np.int64(2), np.bool_(True), torch.tensor(1), torch.tensor([1, 2]), 1j, object()]))
small = st.integers(-2, 9)
blocks = st.one_of(st.lists(st.one_of(small, junk), max_size=4), junk)
REFUSALS = (ValueError, TypeError, NoFreeBlocksError)


def _allocator_state(a: BlockAllocator) -> tuple:
    extra = (dict(a._key_of), list(a._evictable), a.stats.requests) if isinstance(a, PrefixCachingBlockAllocator) else ()
    return (list(a._free), dict(a._ref_counts), a.num_free, *extra)


ops = st.lists(st.one_of(
    st.tuples(st.just("allocate"), st.one_of(small, junk)), st.tuples(st.just("free"), blocks),
    st.tuples(st.just("incref"), blocks), st.tuples(st.just("ref_count"), st.one_of(small, junk)),
    st.tuples(st.just("can_allocate"), st.one_of(small, junk)), st.tuples(st.just("acquire"), blocks),
    st.tuples(st.just("cache_block"), st.one_of(small, junk), st.one_of(st.binary(min_size=1, max_size=3), junk)),
    st.tuples(st.just("find_cached_prefix"), st.one_of(st.lists(st.integers(0, 3), max_size=9), blocks)),
    st.tuples(st.just("free_held"), st.integers(0, 5)),
), max_size=30)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caching=st.booleans(), ops=ops)
def test_fuzz_block_allocators(caching, ops):
    a = (PrefixCachingBlockAllocator if caching else BlockAllocator)(6, 4)
    held: list[int] = []  # blocks handed out, one entry per reference
    for op, *args in ops:
        if op == "free_held":  # a correct caller's free, to keep the pool moving
            k = min(args[0], len(held))
            a.free(held[:k])
            del held[:k]
            continue
        if not hasattr(a, op):
            continue
        before = _allocator_state(a)
        try:
            out = getattr(a, op)(*args)
        except REFUSALS as exc:
            assert _allocator_state(a) == before, f"{op}{tuple(args)} raised {exc!r} but changed the allocator"
            assert str(exc)
            continue
        if op == "allocate":
            held += out
        elif op in ("incref", "acquire"):
            held += [int(b) for b in args[0]]
        elif op == "free":
            for b in args[0]:
                held.remove(int(b))
    if caching:
        a.check_invariants()
    assert a.num_free + len(set(held)) == a.num_blocks


def test_cache_keys_are_bytes():
    a = PrefixCachingBlockAllocator(4, 2)
    b = a.allocate(1)[0]
    for key in (5, "abc", None, [1]):
        with pytest.raises(TypeError, match="key"):
            a.cache_block(b, key)
    assert a.cache_block(b, block_key(b"", [1, 2]))
    with pytest.raises(TypeError, match="bool"):
        a.find_cached_prefix([True, 2, 3])


configs = st.fixed_dictionaries({}, optional={
    "max_batch_size": st.one_of(small, junk), "max_batched_tokens": st.one_of(st.integers(-1, 20), junk),
    "enable_chunked_prefill": st.one_of(st.booleans(), junk), "preemption": st.one_of(st.sampled_from(["swap", "x"]), junk),
    "watermark_blocks": st.one_of(small, junk), "max_model_len": st.one_of(small, junk),
    "eos_token_ids": st.one_of(st.frozensets(st.integers(0, 5)), blocks), "enable_prefix_caching": st.one_of(st.booleans(), junk)})


@settings(max_examples=300, deadline=None)
@given(kw=configs)
def test_fuzz_scheduler_config(kw):
    try:
        cfg = SchedulerConfig(**kw)
    except (ValueError, TypeError) as exc:
        assert str(exc)
        return
    assert type(cfg.max_batch_size) is int and cfg.max_batched_tokens >= cfg.max_batch_size >= 1
    assert type(cfg.enable_chunked_prefill) is bool and all(type(t) is int for t in cfg.eos_token_ids)


def _sched_state(s) -> tuple:
    return (s.waiting, s.active, set(s._unfinished), getattr(s, "_seq", None))


ids = st.one_of(st.text(max_size=2), st.integers(-5, 5), st.floats(allow_nan=True), st.tuples(st.integers(0, 2)),
                st.none(), st.booleans(), st.lists(st.integers(), max_size=1))
part_one_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), ids, st.one_of(st.integers(-1, 6), junk), st.one_of(st.floats(-1, 12), junk),
              st.one_of(st.none(), st.integers(-3, 3), junk)),
    st.tuples(st.just("step"))), max_size=40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from([ContinuousBatchScheduler, StaticBatchScheduler, SkipAheadScheduler, PriorityScheduler]),
       batch=st.integers(1, 4), memory=st.one_of(st.none(), st.floats(1, 12)), ops=part_one_ops)
def test_fuzz_part_one_schedulers(kind, batch, memory, ops):
    sched = kind(batch) if kind is StaticBatchScheduler else kind(batch, memory)
    for op, *args in ops:
        if op == "step":
            sched.step()  # never raises, whatever was accepted before
            continue
        rid, n, cost, prio = args
        before = _sched_state(sched)
        try:
            if kind is PriorityScheduler:
                sched.add_request(rid, n, cost, priority=prio)
            else:
                sched.add_request(rid, n, cost)
        except (ValueError, TypeError) as exc:
            assert _sched_state(sched) == before, f"add_request({rid!r}, {n!r}, {cost!r}) raised {exc!r} but changed it"
    for _ in range(400):
        if not sched.has_unfinished() or (kind is not StaticBatchScheduler and sched.is_blocked()):
            break
        sched.step()
    assert len(sched.active) <= batch


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["alloc", "prefix", "static", "continuous", "skip", "priority"]),
       a=st.one_of(st.integers(-2, 64), st.just(10**18), junk), b=st.one_of(st.none(), st.integers(-2, 64), st.floats(-1, 100), junk),
       aging=st.one_of(st.none(), st.floats(-1, 1e300), junk))
def test_fuzz_constructors(kind, a, b, aging):
    make = {"alloc": lambda: BlockAllocator(a, b), "prefix": lambda: PrefixCachingBlockAllocator(a, b),
            "static": lambda: StaticBatchScheduler(a), "continuous": lambda: ContinuousBatchScheduler(a, b),
            "skip": lambda: SkipAheadScheduler(a, b), "priority": lambda: PriorityScheduler(a, b, aging=aging)}[kind]
    try:
        obj = make()
    except (ValueError, TypeError) as exc:
        assert str(exc)
        return
    if kind in ("alloc", "prefix"):
        assert obj.num_free == obj.num_blocks == a >= 1 and obj.block_size >= 1
        assert len(obj.allocate(min(a, 3))) == min(a, 3)
    else:
        obj.add_request("r", 2)
        assert obj.step() in (["r"], [])  # [] only when the request's default cost exceeds max_memory
