"""Every accepted request makes progress. The submission rule (a request that fits the pool at its
longest is accepted) and the admission rule (the watermark is waived for a request that would run
alone) agree, so random workloads over tiny pools — watermarks up to the whole pool but one block,
swap or recompute, chunked prefill on or off, prefix caching, aborts at random — always finish,
leak no block, and give every request exactly what it gives alone. And if a step ever makes no
progress with work pending, the engine says who is stuck instead of spinning.

Breadth through SimEngine (the engine's scheduler, no model); depth through LLMEngine on a tiny
random model, where "what it gives alone" is a real model's greedy output. Counts print with -s."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from inflight.engine.block_manager import blocks_needed
from inflight.engine.liveness import EngineStalledError, check_progress, max_kv_tokens
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams
from inflight.engine.sequence import Sequence
from inflight.exercises.engine_loop import reference_step
from inflight.sim.engine_sim import SimEngine
from inflight.sim.workloads import Request

torch.set_num_threads(1)
VOCAB = 61
COUNTS: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\nliveness counts:", dict(COUNTS))



# -- the instances the issue reported, and the ones a random search of the old rules found ---------
def test_watermark_with_chunked_prefill_admits_a_prompt_that_needs_every_block(model):
    for chunked in (True, False):
        engine = LLMEngine(model, block_size=4, num_blocks=8, watermark=0.25, enable_chunked_prefill=chunked,
                           max_batched_tokens=64, debug=True)
        out = engine.generate([list(range(1, 30))], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)[0]
        assert out.finish_reason == "length" and len(out.token_ids) == 3  # 32 KV slots: every block of the pool


# (pool, block size, batch, token budget, chunked, preemption, watermark) and (prompt, output, arrival) per
# request: each of these never finished under the old rules (found by a random search of 4,000 workloads,
# 532 of which hung); with swap the swapped-out request could not come back past the watermark, with
# recompute the re-prefill of a grown request could not be admitted past it
OLD_LIVELOCKS = [
    ((9, 4, 4, 14, False, "swap", 5), [(2, 26, 0), (9, 28, 0), (2, 8, 1)]),
    ((10, 4, 3, 23, False, "recompute", 7), [(1, 23, 0), (3, 27, 3), (1, 12, 2)]),
    ((27, 1, 2, 13, False, "recompute", 17), [(2, 13, 2), (2, 24, 2), (4, 22, 2), (4, 24, 1)]),
    ((10, 3, 2, 19, True, "swap", 7), [(5, 14, 0), (2, 18, 3), (8, 11, 2), (2, 16, 0)]),
    ((4, 4, 4, 20, True, "recompute", 3), [(12, 3, 2)]),
    ((8, 4, 2, 20, True, "swap", 7), [(8, 13, 1), (4, 15, 1), (10, 23, 0), (7, 2, 1)]),
]


@pytest.mark.parametrize("knobs, specs", OLD_LIVELOCKS)
def test_old_livelocks_finish(knobs, specs):
    nb, bs, batch, tokens, chunked, preemption, wm = knobs
    engine = _sim(specs, nb, bs, batch, tokens, chunked, preemption, wm)
    assert _run_sim(engine) < 2000
    assert all(s.num_output_tokens == specs[int(s.request_id)][1] for s in engine.seqs)


def test_swapped_request_larger_than_free_minus_watermark_comes_back(model):
    # two requests that cannot both grow: one is swapped out near its full length, more than the
    # pool minus the watermark; it must still come back once the other finishes
    sp = SamplingParams(max_tokens=80, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=24, max_batch_size=2, watermark=0.2, preemption="swap",
                       debug=True)
    outs = engine.generate([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13]], sp, use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [80, 80]
    assert engine.summary()["blocks_swapped"] > 0 and engine.allocator.num_free == engine.num_blocks


# -- the stall detector -----------------------------------------------------------------------------
def test_a_stalled_engine_says_who_is_stuck_and_why(model):
    engine = LLMEngine(model, block_size=4, num_blocks=8, debug=True)
    ok = engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    # slip a request the submission check would have refused past it, straight into the queue
    big = Sequence("too-big", list(range(1, 40)), SamplingParams(max_tokens=4), 0.0, seq_no=99)
    engine.requests["too-big"] = big
    engine.scheduler.add(big)
    with pytest.raises(EngineStalledError) as exc:
        for _ in range(20):
            engine.step()
    msg = str(exc.value)
    assert "'too-big'" in msg and "block(s)" in msg and "abort" in msg
    engine.abort_request("too-big")  # the way out the message names: the rest goes on
    while engine.has_unfinished_requests():
        engine.step()
    assert ok not in engine.requests and engine.allocator.num_free == engine.num_blocks


# -- breadth: random workloads through the engine's scheduler (SimEngine) ----------------------------
def _sim(specs, nb, bs, batch, tokens, chunked, preemption, wm, caching=False, prompts=None):
    reqs = [Request(str(i), p, o, a) for i, (p, o, a) in enumerate(specs)]
    return SimEngine(reqs, num_blocks=nb, block_size=bs, max_batch_size=batch, max_batched_tokens=tokens,
                     enable_chunked_prefill=chunked, preemption=preemption, watermark_blocks=wm,
                     enable_prefix_caching=caching, prompts=prompts)


def _run_sim(engine, aborts=(), limit=3000) -> int:
    """Run to the end with the engine's order and checks; abort (step, request) pairs on the way."""
    sched = engine.scheduler
    aborts = sorted(aborts)
    while not engine.done():
        while aborts and aborts[0][0] <= engine.step_no:
            engine.abort(aborts.pop(0)[1])
        engine.run_step(reference_step)
        check_progress(sched, engine._batch)  # raises EngineStalledError on a step that changed nothing
        sched.check_invariants()
        assert engine.step_no < limit, "no progress: livelock"
    sched.reap()
    assert sched.allocator.num_free == sched.allocator.num_blocks, "blocks leaked"
    if sched.cpu_allocator is not None:
        assert sched.cpu_allocator.num_free == sched.cpu_allocator.num_blocks, "CPU blocks leaked"
    return engine.step_no


workload = st.lists(st.tuples(st.integers(1, 24), st.integers(1, 24), st.integers(0, 12)), min_size=1, max_size=10)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=workload, bs=st.integers(1, 5), extra=st.integers(0, 3), batch=st.integers(1, 5),
       tokens=st.integers(0, 24), chunked=st.booleans(), preemption=st.sampled_from(["recompute", "swap"]),
       wm_frac=st.floats(0, 1), caching=st.booleans(), vocab=st.integers(1, 4), seed=st.integers(0, 2**16),
       n_aborts=st.integers(0, 3))
def test_random_tiny_pool_workloads_always_finish(specs, bs, extra, batch, tokens, chunked, preemption, wm_frac,
                                                  caching, vocab, seed, n_aborts):
    nb = max(blocks_needed(max_kv_tokens(p, o, 10**6), bs) for p, o, _ in specs) + extra  # the submission rule
    wm = min(nb - 1, int(wm_frac * nb))  # up to the whole pool but one block
    rng = random.Random(seed)
    prompts = {str(i): [rng.randrange(vocab) for _ in range(p)] for i, (p, _, _) in enumerate(specs)}  # shared prefixes
    engine = _sim(specs, nb, bs, batch, batch + tokens, chunked, preemption, wm, caching, prompts)
    aborts = [(rng.randrange(30), str(rng.randrange(len(specs)))) for _ in range(n_aborts)]
    steps = _run_sim(engine, aborts)
    ended = [s for s in engine.seqs if s.finish_reason != "abort"]
    assert all(s.num_output_tokens == specs[int(s.request_id)][1] and s.finish_reason == "length" for s in ended)
    assert len(engine.seqs) == len(specs)
    COUNTS["SimEngine workloads"] += 1
    COUNTS["SimEngine steps"] += steps
    COUNTS["SimEngine aborts"] += len(engine.seqs) - len(ended)


# -- depth: the real engine on a tiny random model ---------------------------------------------------
_ALONE: dict = {}


def _alone(model, prompt, max_tokens):
    key = (tuple(prompt), max_tokens)
    if key not in _ALONE:
        engine = LLMEngine(model, block_size=4, num_blocks=64, debug=True)
        _ALONE[key] = engine.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                      use_tqdm=False)[0].token_ids
    return _ALONE[key]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(specs=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 16), st.integers(0, 6)), min_size=1, max_size=6),
       bs=st.integers(1, 4), extra=st.integers(0, 2), batch=st.integers(1, 4), tokens=st.integers(0, 16),
       chunked=st.booleans(), preemption=st.sampled_from(["recompute", "swap"]), wm_frac=st.floats(0, 0.99),
       caching=st.booleans(), seed=st.integers(0, 2**16), n_aborts=st.integers(0, 2))
def test_random_tiny_pool_workloads_on_the_real_engine(model, specs, bs, extra, batch, tokens, chunked, preemption,
                                                       wm_frac, caching, seed, n_aborts):
    rng = random.Random(seed)
    shared = [rng.randrange(1, VOCAB) for _ in range(12)]
    prompts = [(shared[:rng.randint(0, p)] + [rng.randrange(1, VOCAB) for _ in range(p)])[:p] for p, _, _ in specs]
    nb = max(blocks_needed(max_kv_tokens(len(p), o, 128), bs) for p, (_, o, _) in zip(prompts, specs)) + extra
    engine = LLMEngine(model, block_size=bs, num_blocks=nb, max_batch_size=batch, max_batched_tokens=batch + tokens,
                       enable_chunked_prefill=chunked, preemption=preemption, watermark=wm_frac,
                       enable_prefix_caching=caching, debug=True)
    arrivals = sorted((a, i) for i, (_, _, a) in enumerate(specs))
    aborts = {rng.randrange(20): rng.randrange(len(specs)) for _ in range(n_aborts)}
    ids, final, aborted, step = {}, {}, set(), 0
    while arrivals or engine.has_unfinished_requests():
        while arrivals and arrivals[0][0] <= step:
            i = arrivals.pop(0)[1]
            ids[i] = engine.add_request(prompts[i], SamplingParams(max_tokens=specs[i][1], ignore_eos=True))
        if step in aborts and aborts[step] in ids and ids[aborts[step]] in engine.requests:
            engine.abort_request(ids[aborts[step]])
            aborted.add(aborts[step])
        final.update((o.request_id, o) for o in engine.step() if o.finished)
        step += 1
        assert step < 3000, "no progress: livelock"
    assert engine.allocator.num_free == engine.num_blocks and not engine.requests
    for i, rid in ids.items():
        if i not in aborted:
            assert final[rid].token_ids == _alone(model, prompts[i], specs[i][1]), f"request {i} differs from alone"
    COUNTS["LLMEngine workloads"] += 1
    COUNTS["LLMEngine steps"] += step
    COUNTS["LLMEngine preemptions"] += engine.summary()["preemptions"]
