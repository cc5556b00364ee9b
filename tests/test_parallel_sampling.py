"""Parallel sampling (`SamplingParams(n=...)`) on real (small, random) Llama weights: one prefill,
blocks shared by reference count and copied on the first diverging write, each sample growing,
preempted and finishing on its own. Greedy samples equal each other and n=1; seeded sample i is
the n=1 request seeded `seed + i`, however the engine is squeezed. Every engine runs with
debug=True: the scheduler's invariants (samples included) after every step, and before every
forward pass the check that no token is written into a block someone else holds."""
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from inflight.engine.liveness import samples_blocks
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams

VOCAB = 61


def _drain(engine):
    final, seen = {}, []
    while engine.has_unfinished_requests():
        outs = engine.step()
        seen += outs
        final.update((o.request_id, o) for o in outs if o.finished)
    return final, seen


def _alone(model, prompt, sp):
    return LLMEngine(model, block_size=4, num_blocks=64, debug=True).generate([prompt], sp, use_tqdm=False)[0]


def _prompts(n, seed, lo=3, hi=14):
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def test_greedy_samples_are_identical_and_one_prefill_feeds_them(model):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5]  # 9 tokens: two full blocks of 4 and one partly filled
    one = _alone(model, prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    engine = LLMEngine(model, block_size=4, num_blocks=64, debug=True)
    copies = []
    cache_copy = engine.kv_cache.copy_blocks
    engine.scheduler.copy_blocks = lambda pairs: (copies.extend(pairs), cache_copy(pairs))
    out = engine.generate([prompt], SamplingParams(n=4, max_tokens=10, ignore_eos=True), use_tqdm=False)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert all(o.token_ids == one.token_ids for o in out.outputs) and out.token_ids == one.token_ids
    assert engine.summary()["prefill_tokens"] == len(prompt), "the prompt is prefilled once, not once per sample"
    assert len(copies) == 3, "three samples copy the shared last block; the fourth writes in place"
    assert max(s.blocks_used for s in engine.stats) == samples_blocks(4, len(prompt), 10, 128, 4) == 2 + 4 * 3
    assert engine.allocator.num_free == engine.num_blocks and not engine.requests


def test_a_prompt_that_fills_its_blocks_needs_no_copy(model):
    engine = LLMEngine(model, block_size=4, num_blocks=64, debug=True)
    copies = []
    engine.scheduler.copy_blocks = copies.extend
    engine.generate([list(range(1, 9))], SamplingParams(n=3, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert copies == [], "the first generated token starts a new block: nothing shared is written"


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("caching", [False, True])
def test_squeezed_samples_match_n1_greedy_and_seeded(model, preemption, caching):
    prompts = _prompts(7, seed=3)
    rng = random.Random(4)
    params = [SamplingParams(n=rng.choice([1, 2, 3, 4]), max_tokens=rng.randint(4, 14), ignore_eos=True,
                             temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000)) for _ in prompts]
    engine = LLMEngine(model, block_size=4, num_blocks=16, max_batch_size=6, max_batched_tokens=12,
                       preemption=preemption, enable_prefix_caching=caching, debug=True)
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert engine.summary()["preemptions"] > 0, "the pool should be small enough to preempt samples"
    for p, sp, out in zip(prompts, params, outs):
        assert len(out.outputs) == sp.n and out.finished
        for o in out.outputs:  # sample i is the n=1 request seeded seed + i
            alone = _alone(model, p, SamplingParams(max_tokens=sp.max_tokens, ignore_eos=True,
                                                    temperature=sp.temperature, seed=sp.seed + o.index))
            assert o.token_ids == alone.token_ids, (sp, o.index)
    assert engine.allocator.num_used == 0 and not engine.requests
    if preemption == "swap":
        assert engine.scheduler.cpu_allocator.num_used == 0


def test_samples_finish_and_free_on_their_own(model):
    engine = LLMEngine(model, block_size=4, num_blocks=64, debug=True)
    sp = SamplingParams(n=4, max_tokens=30, temperature=1.0, seed=11, stop_token_ids=list(range(1, 25)))
    rid = engine.add_request([7, 8, 9, 10, 11, 12], sp)
    final, seen = _drain(engine)
    out = final[rid]
    lengths = sorted(len(o.token_ids) for o in out.outputs)
    assert len(set(lengths)) > 1, "seeded samples should stop at different steps"
    assert [o.finished for o in seen[-1].outputs] == [True] * 4 and [o.finished for o in seen[:-1]].count(True) == 0
    # while some samples ran, the ones that had stopped held no block any more
    assert all(o.finish_reason == "stop" or len(o.token_ids) == 30 for o in out.outputs)
    assert len(seen) == max(lengths), "one RequestOutput per step for the whole request"
    assert out.finish_time == max(o.finish_time for o in out.outputs)
    assert engine.allocator.num_free == engine.num_blocks


def test_abort_ends_every_sample_wherever_they_are(model):
    engine = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=6, preemption="swap", debug=True)
    sp = SamplingParams(n=3, max_tokens=20, ignore_eos=True)
    forked = engine.add_request([1, 2, 3, 4, 5], sp)
    waiting = engine.add_request([6, 7, 8] * 5, SamplingParams(n=4, max_tokens=20, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert len([s for s in engine.scheduler.running if s.request_id == forked]) == 3
    assert [s.request_id for s in engine.scheduler.waiting] == [waiting], "4 samples need 4 of the 3 free slots"
    engine.abort_request(forked)
    engine.abort_request(waiting)
    engine.check_invariants()
    assert not engine.requests and engine.allocator.num_used == 0
    with pytest.raises(KeyError):
        engine.get_output(forked)


def test_streamed_outputs_group_the_samples(model):
    engine = LLMEngine(model, block_size=4, num_blocks=40, debug=True)
    rid = engine.add_request([5, 6, 7], SamplingParams(n=2, max_tokens=3, ignore_eos=True, temperature=1.0, seed=1))
    steps = []
    while engine.has_unfinished_requests():
        steps += engine.step()
    assert [o.request_id for o in steps] == [rid] * 3
    assert [[len(c.token_ids) for c in o.outputs] for o in steps] == [[1, 1], [2, 2], [3, 3]]
    assert [o.finished for o in steps] == [False, False, True]
    assert steps[-1].token_ids == steps[-1].outputs[0].token_ids and steps[-1].ttft > 0


@pytest.mark.parametrize("kw, words", [
    (dict(n=0), "n must be >= 1"),
    (dict(n=2.0), "n must be an int"),
    (dict(n=9), "max_batch_size"),
    (dict(n=4, max_tokens=40), "more than the whole pool"),
    (dict(logprobs=21), "logprobs must be <= 20"),
    (dict(prompt_logprobs=-1), "prompt_logprobs must be >= 0"),
    (dict(logprobs=True), "logprobs must be an int"),
])
def test_bad_sampling_values_are_refused_and_change_nothing(model, kw, words):
    engine = LLMEngine(model, block_size=4, num_blocks=24, max_batch_size=8, debug=True)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    before = (len(engine.scheduler.waiting), len(engine.scheduler.running), engine.allocator.num_free,
              tuple(engine.requests), engine._next_seq_no)
    with pytest.raises((ValueError, TypeError), match=words):
        engine.add_request([4, 5, 6, 7, 8], SamplingParams(**{"max_tokens": 4, **kw}))
    sp = SamplingParams(max_tokens=4)
    for name, value in kw.items():  # changed after construction: caught at submission all the same
        setattr(sp, name, value)
    with pytest.raises((ValueError, TypeError), match=words.split(" must")[0]):
        engine.add_request([4, 5, 6, 7, 8], sp)
    assert (len(engine.scheduler.waiting), len(engine.scheduler.running), engine.allocator.num_free,
            tuple(engine.requests), engine._next_seq_no) == before


def test_tiny_model_samples_have_their_own_texts_and_stop_strings():
    from inflight.model.loading import load_tiny

    try:
        tiny, tok = load_tiny()
    except FileNotFoundError:
        pytest.skip("the shipped tiny model is not there yet")
    engine = LLMEngine(tiny, tokenizer=tok, block_size=8, num_blocks=64, debug=True)
    sp = SamplingParams(n=3, max_tokens=24, temperature=1.0, seed=2, stop=[" the"])
    out = engine.generate(["Once upon a time"], sp, use_tqdm=False)[0]
    for o in out.outputs:
        assert o.text == tok.decode(o.token_ids).split(" the")[0]
        assert (o.finish_reason == "stop") == (o.stop_reason == " the")
    assert len({o.text for o in out.outputs}) > 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_samples_under_pressure_aborts_and_caching(model, data):
    bs = data.draw(st.sampled_from([2, 4]))
    kw = dict(block_size=bs, num_blocks=data.draw(st.integers(40 // bs, 96 // bs)),
              max_batch_size=data.draw(st.integers(4, 8)), max_batched_tokens=data.draw(st.sampled_from([8, 16, 64])),
              preemption=data.draw(st.sampled_from(["recompute", "swap"])),
              enable_prefix_caching=data.draw(st.booleans()), enable_chunked_prefill=data.draw(st.booleans()))
    engine = LLMEngine(model, debug=True, **kw)
    shared = [data.draw(st.integers(1, VOCAB - 1)) for _ in range(data.draw(st.integers(0, 9)))]
    reqs = {}
    for i in range(data.draw(st.integers(1, 5))):
        prompt = shared + [data.draw(st.integers(1, VOCAB - 1)) for _ in range(data.draw(st.integers(1, 6)))]
        sp = SamplingParams(n=data.draw(st.integers(1, min(4, kw["max_batch_size"]))), ignore_eos=True,
                            max_tokens=data.draw(st.integers(1, 10)))
        try:
            reqs[engine.add_request(prompt, sp)] = (prompt, sp)
        except ValueError as exc:  # too many samples for this small pool: refused, nothing changed
            assert "samples" in str(exc)
    aborted = set()
    final = {}
    for step in range(3000):
        if not engine.has_unfinished_requests():
            break
        if reqs and data.draw(st.integers(0, 9)) == 0:
            rid = data.draw(st.sampled_from(sorted(reqs)))
            engine.abort_request(rid)
            aborted.add(rid)
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    assert not engine.has_unfinished_requests()
    for rid, (prompt, sp) in reqs.items():
        if rid in aborted and rid not in final:
            continue
        want = _alone(model, prompt, SamplingParams(max_tokens=sp.max_tokens, ignore_eos=True)).token_ids
        assert [o.token_ids for o in final[rid].outputs] == [want] * sp.n
    assert engine.allocator.num_used == 0 and not engine.requests
    if kw["preemption"] == "swap":
        assert engine.scheduler.cpu_allocator.num_used == 0
