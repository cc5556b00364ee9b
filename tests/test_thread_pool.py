"""The C kernels' own thread pool (`inflight.model.thread_pool`, `csrc/thread_pool.c`): every item run
exactly once on a thread of the team, whatever the split, the spin or the callers; the kernels give
the same bits on the pool, on OpenMP and on one thread."""
from __future__ import annotations

import ctypes
import os
import threading

import pytest
import torch
from hypothesis import given, settings, strategies as st

from inflight.model import cpu_attention, fused_ops, skinny_gemm, thread_pool

pytestmark = pytest.mark.skipif(thread_pool.load() is None, reason=f"no pool here: {thread_pool.build_error()}")

TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int)


def _pool_for(n: int, threads: int, chunk: int) -> list[tuple[int, int, int]]:
    """Run the pool over [0, n) with a Python task that records (begin, end, thread)."""
    seen: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    @TASK
    def task(ctx, begin, end, tid):
        with lock:
            seen.append((begin, end, tid))

    thread_pool.load().inflight_pool_for(ctypes.c_int64(n), threads, ctypes.c_int64(chunk), task, None)
    return seen


def _covered_once(n: int, seen: list[tuple[int, int, int]]) -> bool:
    items = sorted(i for b, e, _ in seen for i in range(b, e))
    return items == list(range(n))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), threads=st.integers(1, 6), chunk=st.integers(0, 9), spin=st.sampled_from([0, 50_000]))
def test_every_item_runs_exactly_once_on_a_thread_of_the_team(n, threads, chunk, spin):
    old = thread_pool.spin()
    thread_pool.set_spin(spin)
    try:
        seen = _pool_for(n, threads, chunk)
    finally:
        thread_pool.set_spin(old)
    assert _covered_once(n, seen)
    assert all(0 <= tid < threads for _, _, tid in seen)
    if threads == 1:  # nothing to share: one call over everything
        assert len(seen) == (1 if n else 0)
    elif chunk:
        assert all(e - b <= chunk for b, e, _ in seen)
    else:  # an even split into one piece per thread, each piece claimed by whoever comes first
        pieces = min(threads, n)
        assert sorted((b, e) for b, e, _ in seen) == [(n * p // pieces, n * (p + 1) // pieces) for p in range(pieces)
                                                       if n * p // pieces < n * (p + 1) // pieces]


def test_two_callers_at_once_each_get_all_their_items():
    results = {}

    def call(key):
        results[key] = [_pool_for(500, 2, 3) for _ in range(20)]

    ts = [threading.Thread(target=call, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(_covered_once(500, seen) for runs in results.values() for seen in runs)


def test_spin_and_counters():
    old = thread_pool.spin()
    try:
        thread_pool.set_spin(0)
        assert thread_pool.spin() == 0
        before = thread_pool.stats()
        _pool_for(64, 2, 0)
        after = thread_pool.stats()
        assert after["jobs"] == before["jobs"] + 1 and after["threads"] >= 2
        thread_pool.set_spin(-5)  # nonsense is read as "sleep at once"
        assert thread_pool.spin() == 0
    finally:
        thread_pool.set_spin(old)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_workers():
    _pool_for(10, 2, 0)  # the parent's workers exist
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers aren't here; a job must still finish, all of it
        ok = _covered_once(1000, _pool_for(1000, 3, 7))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _kernel_outputs():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(48, 256, generator=g), torch.randn(1376, 256, generator=g)
    h, weight = torch.randn(300, 256, generator=g), torch.randn(256, generator=g)
    gate_up = torch.randn(300, 1376, generator=g)
    q = torch.randn(40, 4, 64, generator=g)
    kc, vc = torch.randn(64, 16, 2, 64, generator=g), torch.randn(64, 16, 2, 64, generator=g)
    tables = torch.randperm(64, generator=g)[:40].reshape(40, 1).int()
    lens = torch.randint(1, 17, (40,), generator=g).int()
    return [skinny_gemm.kernel_linear(x, w), fused_ops.rms_norm(h, weight, 1e-5), fused_ops.silu_and_mul(gate_up),
            cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, 0.125)]


@pytest.mark.skipif(any(m.load() is None for m in (skinny_gemm, fused_ops, cpu_attention)), reason="needs the C kernels")
def test_kernels_give_the_same_bits_on_the_pool_on_openmp_and_on_one_thread():
    outs = []
    try:
        for threads, openmp in ((2, False), (3, False), (2, True), (1, False)):
            thread_pool.use(threads, openmp=openmp)
            outs.append(_kernel_outputs())
    finally:
        thread_pool.use(None, openmp=not _passive())
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert torch.equal(a, b)


def _passive() -> bool:
    from inflight.threads import passive_wait_in_effect

    return passive_wait_in_effect()


def test_the_kernels_follow_torchs_thread_count_unless_told():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert thread_pool.threads() == 1
        thread_pool.use(3, openmp=thread_pool.on_openmp())
        assert thread_pool.threads() == 3
        thread_pool.use(None, openmp=thread_pool.on_openmp())
        assert thread_pool.threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_library_attached_with_the_pool_turned_off_stays_on_openmp(monkeypatch, tmp_path):
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path))  # a library of its own, not the one already attached
    fresh = fused_ops._library.fresh()
    monkeypatch.setattr(fused_ops, "_library", fresh)
    monkeypatch.setattr(thread_pool, "_attached", list(thread_pool._attached))
    monkeypatch.setenv("INFLIGHT_THREAD_POOL", "0")
    lib = fused_ops.load()
    if lib is None:
        pytest.skip("needs the C kernels")
    assert thread_pool.BACKENDS[lib.inflight_parallel_backend()] in ("OpenMP", "one thread")
    assert lib not in thread_pool._attached


def test_a_late_worker_never_holds_the_caller_back():
    """Workers that sleep (spin 0) take a futex wake-up and a trip through the scheduler to start; a
    two-piece job whose pieces take no time is over long before that, because the caller claims the
    worker's piece too (the count of pieces it took beyond its share says so), and every item still
    runs exactly once."""
    old = thread_pool.spin()
    thread_pool.set_spin(0)
    try:
        before = thread_pool.stats()
        runs = [_pool_for(2, 2, 0) for _ in range(300)]
        after = thread_pool.stats()
    finally:
        thread_pool.set_spin(old)
    assert all(_covered_once(2, seen) for seen in runs)
    assert after["pieces"] - before["pieces"] == 600
    assert after["taken_by_caller"] > before["taken_by_caller"]
