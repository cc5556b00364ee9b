"""LLMEngine end to end on real (small, random) Llama weights: outputs never depend on batching,
preemption mode, chunked prefill or memory pressure; bad input never takes down other requests.
Every engine here runs with debug=True, so the scheduler's invariants are checked after every step."""
import random

import pytest
import torch

from inflight.engine.llm_engine import LLMEngine, RequestOutput
from inflight.engine.sampling import SamplingParams

torch.set_num_threads(1)

VOCAB = 61



def _prompts(n, seed, lo=1, hi=30):
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _drain(engine):
    """Step until nothing is left; the final output of every request that ended, by id (the engine
    forgets a request once its final output is returned)."""
    final = {}
    while engine.has_unfinished_requests():
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    return final


def _alone(model, prompts, params):
    """Each prompt run by itself in a roomy engine: the reference every batched run must match."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    return [LLMEngine(model, block_size=4, num_blocks=64, debug=True).generate([p], sp, use_tqdm=False)[0].token_ids
            for p, sp in zip(prompts, params)]


@pytest.fixture(scope="module")
def workload(model):
    prompts = _prompts(12, seed=1)
    rng = random.Random(2)
    params = [SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in prompts]
    return prompts, params, _alone(model, prompts, params)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("chunked", [True, False])
def test_greedy_identical_to_alone_under_memory_pressure(model, workload, preemption, chunked):
    prompts, params, alone = workload
    engine = LLMEngine(model, block_size=4, num_blocks=14, max_batch_size=8, max_batched_tokens=24 if chunked else 40,
                       preemption=preemption, enable_chunked_prefill=chunked, debug=True)
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == alone
    assert [o.request_id for o in outs] == sorted((o.request_id for o in outs), key=int)  # prompt order
    summary = engine.summary()
    assert summary["preemptions"] >= 5, "the pool should be small enough to force preemptions"
    if preemption == "swap":
        assert summary["blocks_swapped"] > 0 and summary["swap_bytes"] > 0
    assert engine.allocator.num_free == engine.num_blocks  # everything returned
    assert all(o.finished and o.finish_reason == "length" for o in outs)
    assert all(len(o.token_ids) == sp.max_tokens for o, sp in zip(outs, params))


def test_chunked_prefill_splits_long_prompts(model):
    prompts = _prompts(3, seed=5, lo=40, hi=60)
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=64, max_batch_size=4, max_batched_tokens=16, debug=True)
    outs = engine.generate(prompts, sp, use_tqdm=False)
    assert [o.token_ids for o in outs] == _alone(model, prompts, sp)
    assert max(s.num_prefill_tokens + s.num_decode_tokens for s in engine.stats) <= 16


def test_tiny_token_budget_without_chunking_still_runs_long_prompt_alone(model):
    prompts = _prompts(2, seed=6, lo=30, hi=40)
    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=64, max_batch_size=2, max_batched_tokens=8,
                       enable_chunked_prefill=False, debug=True)
    assert [o.token_ids for o in engine.generate(prompts, sp, use_tqdm=False)] == _alone(model, prompts, sp)


def test_matches_transformers_generate(tmp_path):
    transformers = pytest.importorskip("transformers")
    from inflight.model.loading import load_pretrained

    torch.manual_seed(3)
    hf_cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(str(tmp_path))
    prompts = _prompts(6, seed=4, hi=20)
    n = 12
    expected = []
    for p in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0, eos_token_id=None)
        expected.append(out[0, len(p):].tolist())
    for preemption in ("recompute", "swap"):
        engine = LLMEngine(ours, block_size=4, num_blocks=14, max_batch_size=6, max_batched_tokens=16,
                           preemption=preemption, debug=True)
        outs = engine.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True), use_tqdm=False)
        assert [o.token_ids for o in outs] == expected
        assert engine.summary()["preemptions"] > 0


def test_tiny_model_batched_equals_alone():
    from inflight.model.loading import load_tiny

    try:
        model, tok = load_tiny()
    except FileNotFoundError:  # TODO: drop once the tiny model's weights are committed
        pytest.skip("the shipped tiny model is not there yet")
    texts = ["Once upon a time", "The cat", "In the beginning the", "A", "Hello, world. Hello"]
    sp = SamplingParams(max_tokens=20)
    alone = [LLMEngine(model, tokenizer=tok, block_size=8, num_blocks=32, debug=True).generate([t], sp, use_tqdm=False)[0]
             for t in texts]
    for preemption in ("recompute", "swap"):
        engine = LLMEngine(model, tokenizer=tok, block_size=8, num_blocks=8, max_batch_size=4,
                           max_batched_tokens=16, preemption=preemption, debug=True)
        outs = engine.generate(texts, sp, use_tqdm=False)
        assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
        assert [o.text for o in outs] == [tok.decode(a.token_ids) for a in alone]
        assert all(o.finish_reason in ("stop", "length") for o in outs)


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt, params, error, words", [
    ([], SamplingParams(max_tokens=4), ValueError, "empty prompt"),
    (list(range(1, 60)) * 3, SamplingParams(max_tokens=4), ValueError, "context"),
    ([1, 2, 3], SamplingParams(max_tokens=100, ignore_eos=True), ValueError, "whole pool"),
    ([1, 2, VOCAB + 5], SamplingParams(max_tokens=4), ValueError, "vocabulary"),
    ([1, 2.5, 3], SamplingParams(max_tokens=4), TypeError, "ints"),
    ("a string", SamplingParams(max_tokens=4), TypeError, "tokenizer"),
    ([1, 2, 3], SamplingParams(max_tokens=4, stop_token_ids=(VOCAB + 1,)), ValueError, "vocabulary"),
    ([1, 2, 3], {"max_tokens": 4}, TypeError, "SamplingParams"),
])
def test_bad_requests_rejected_and_the_rest_completes(model, prompt, params, error, words):
    prompts = _prompts(4, seed=7)
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=20, max_batch_size=4, debug=True)
    ids = [engine.add_request(p, sp) for p in prompts[:2]]
    engine.step()
    before = (len(engine.scheduler.waiting), len(engine.scheduler.running), engine.allocator.num_free, len(engine.requests))
    with pytest.raises(error, match=words):
        engine.add_request(prompt, params)
    assert (len(engine.scheduler.waiting), len(engine.scheduler.running), engine.allocator.num_free,
            len(engine.requests)) == before
    ids += [engine.add_request(p, sp) for p in prompts[2:]]
    final = _drain(engine)
    assert [final[i].token_ids for i in ids] == _alone(model, prompts, sp)


def test_bad_sampling_params_rejected_at_construction_and_submission(model):
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(TypeError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=["</s>"])
    with pytest.raises(TypeError, match="stop_token_ids"):
        SamplingParams(stop_token_ids="x")
    with pytest.raises(TypeError, match="max_tokens"):
        SamplingParams(max_tokens=2.5)
    sp = SamplingParams(max_tokens=3)
    sp.max_tokens = 0  # changed after construction: caught at submission
    engine = LLMEngine(model, block_size=4, num_blocks=8, debug=True)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request([1, 2], sp)
    assert not engine.has_unfinished_requests()


def test_generate_with_one_bad_prompt_leaves_engine_untouched(model):
    engine = LLMEngine(model, block_size=4, num_blocks=20, debug=True)
    with pytest.raises(ValueError, match="prompt 2: empty prompt"):
        engine.generate([[1, 2], [3], [], [4]], SamplingParams(max_tokens=3), use_tqdm=False)
    assert not engine.requests and not engine.has_unfinished_requests()
    outs = engine.generate([[1, 2], [3]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert [len(o.token_ids) for o in outs] == [3, 3]


def test_duplicate_request_id_rejected(model):
    engine = LLMEngine(model, block_size=4, num_blocks=20, debug=True)
    engine.add_request([1, 2], SamplingParams(max_tokens=2), request_id="a")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([3], SamplingParams(max_tokens=2), request_id="a")


def test_bad_engine_arguments(model):
    with pytest.raises(ValueError, match="preemption"):
        LLMEngine(model, num_blocks=8, preemption="drop")
    with pytest.raises(ValueError, match="max_batched_tokens"):
        LLMEngine(model, num_blocks=8, max_batch_size=16, max_batched_tokens=8)
    with pytest.raises(ValueError, match="watermark"):
        LLMEngine(model, num_blocks=8, watermark=1.5)


# -- abort, finish reasons, streaming ---------------------------------------------------------
def test_abort_frees_blocks_wherever_the_request_is(model):
    prompts = _prompts(6, seed=8, lo=10, hi=20)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=24, max_batch_size=3, preemption="swap", debug=True)
    ids = [engine.add_request(p, sp) for p in prompts]
    for _ in range(3):
        engine.step()
    running = engine.scheduler.running[0]
    held = len(running.block_table)
    free = engine.allocator.num_free
    engine.abort_request(running.request_id)
    assert engine.allocator.num_free == free + held
    waiting = engine.scheduler.waiting[-1].request_id
    engine.abort_request(waiting)
    engine.abort_request("no-such-request")  # ignored
    done = [s for s in engine.scheduler.running if s.finish_reason is not None]
    for s in done:  # finished (final output returned) but not yet reaped: aborting changes nothing
        engine.abort_request(s.request_id)
        assert s.finish_reason == "length"
    engine.check_invariants()
    assert running.finish_reason == "abort" and running.request_id not in engine.requests  # forgotten at once
    outs = _drain(engine)
    assert running.request_id not in outs and waiting not in outs
    assert sorted(outs) == sorted(i for i in ids if i not in (running.request_id, waiting))
    assert all(o.finish_reason == "length" for o in outs.values())
    assert engine.allocator.num_free == engine.num_blocks
    assert engine.scheduler.cpu_allocator.num_free == engine.scheduler.cpu_allocator.num_blocks


def test_finish_reasons(model):
    engine = LLMEngine(model, block_size=4, num_blocks=40, debug=True)
    free_run = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=10, ignore_eos=True), use_tqdm=False)[0].token_ids
    stop_at = free_run[3]
    out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=10, stop_token_ids=[stop_at], ignore_eos=True),
                          use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.token_ids == free_run[:free_run.index(stop_at) + 1]
    out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 2
    # EOS (the model's eos_token_id) stops unless ignore_eos; here we make the first sampled token the EOS
    engine.eos_token_ids = frozenset({free_run[0]})
    engine.scheduler.config.eos_token_ids = engine.eos_token_ids
    out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=10), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.token_ids == free_run[:1]
    out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=10, ignore_eos=True), use_tqdm=False)[0]
    assert out.token_ids == free_run
    # the model's context ends generation too
    long = list(range(1, 60)) * 2 + [1] * 6  # 124 tokens of a 128-token context
    out = engine.generate([long], SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_streaming_outputs_and_timing(model):
    engine = LLMEngine(model, block_size=4, num_blocks=40, debug=True)
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    seen: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        seen += engine.step()
    assert [len(o.token_ids) for o in seen] == [1, 2, 3, 4, 5]
    assert [o.finished for o in seen] == [False] * 4 + [True]
    last = seen[-1]
    assert last.request_id == rid and last.ttft > 0 and last.tpot > 0
    assert last.arrival_time <= last.first_token_time <= last.finish_time
    assert len(last.token_times) == 5 and last.token_times == sorted(last.token_times)
    st = engine.stats[0]
    assert st.num_prefill_tokens == 3 and st.batch_size == 1 and st.blocks_used == 1
    assert engine.allocator.num_free == engine.num_blocks  # the last step, leaving nothing to do, reaped at once
    assert not engine.requests  # and the engine forgot the request once its final output was out


def test_priority_admits_lower_value_first(model):
    engine = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=1, debug=True)
    low = engine.add_request([1, 2], SamplingParams(max_tokens=2, ignore_eos=True, priority=5))
    high = engine.add_request([3, 4], SamplingParams(max_tokens=2, ignore_eos=True, priority=0))
    first = engine.step()
    assert [o.request_id for o in first] == [high]
    final = _drain(engine)
    assert final[high].finish_time < final[low].first_token_time


def test_preemption_victim_is_lowest_priority(model):
    # two requests that cannot both grow in the pool: the low-priority one is preempted, even though it arrived first
    engine = LLMEngine(model, block_size=4, num_blocks=6, max_batch_size=2, debug=True)
    low = engine.add_request([1] * 4, SamplingParams(max_tokens=12, ignore_eos=True, priority=1))
    high = engine.add_request([2] * 4, SamplingParams(max_tokens=12, ignore_eos=True, priority=0))
    final = _drain(engine)
    assert final[low].num_preemptions >= 1 and final[high].num_preemptions == 0


# -- sampling ---------------------------------------------------------------------------------
def test_seeded_sampling_reproducible_regardless_of_batch(model):
    sp = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=1234, ignore_eos=True)
    prompt = [3, 1, 4, 1, 5]
    alone = LLMEngine(model, block_size=4, num_blocks=40, debug=True).generate([prompt], sp, use_tqdm=False)[0].token_ids
    others = _prompts(7, seed=9)
    mix = [SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True),
           SamplingParams(max_tokens=10, ignore_eos=True),
           SamplingParams(max_tokens=14, temperature=0.5, seed=7, ignore_eos=True)]
    for preemption in ("recompute", "swap"):
        engine = LLMEngine(model, block_size=4, num_blocks=16, max_batch_size=5, max_batched_tokens=16,
                           preemption=preemption, debug=True)
        outs = engine.generate(others[:3] + [prompt] + others[3:], mix + [sp] + mix + mix[:1], use_tqdm=False)
        assert outs[3].token_ids == alone
        assert engine.summary()["preemptions"] > 0
    # the sampler really samples: a different seed gives a different continuation
    other = LLMEngine(model, block_size=4, num_blocks=40).generate(
        [prompt], SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=99, ignore_eos=True), use_tqdm=False)[0]
    assert other.token_ids != alone


def test_contiguous_cache_is_one_block_per_request(model, workload):
    # the baseline the paged cache improves on: block_size = context, one block per request
    prompts, params, alone = workload
    engine = LLMEngine(model, block_size=128, num_blocks=4, max_batch_size=4, debug=True)
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == alone
    assert max(s.blocks_used for s in engine.stats) <= 4 and engine.summary()["preemptions"] == 0


def test_generate_asks_for_final_outputs_only_and_gets_what_streaming_gets():
    """generate() snapshots only the requests that end (vLLM's FINAL_ONLY); every step still decodes
    every request's text, so a stop string ends its request at the same token either way."""
    from inflight.model.loading import load_tiny

    model, tok = load_tiny()
    prompts = ["def main():\n    ", "import os\n", "class A:\n", "x = [1, 2"]
    params = [SamplingParams(max_tokens=40, temperature=0.0, stop=[" of "]),  # (greedy text: '"""Return the content of')
              SamplingParams(max_tokens=30, temperature=0.9, seed=2, stop=["os", ")"]),
              SamplingParams(max_tokens=25, temperature=0.0, n=2, seed=4),
              SamplingParams(max_tokens=20, temperature=0.7, seed=9, logprobs=2)]

    def engine():
        return LLMEngine(model, tokenizer=tok, max_batch_size=2, block_size=8, num_blocks=64)

    final = engine().generate(prompts, params, use_tqdm=False)
    e = engine()
    for i, (p, sp) in enumerate(zip(prompts, params)):
        e.add_request(p, sp, request_id=str(i))
    streamed, seen = {}, 0
    while e.has_unfinished_requests():
        for out in e.step():
            seen += 1
            if out.finished:
                streamed[out.request_id] = out
    assert seen > len(prompts)  # step() keeps giving every request's progress
    assert any(c.finish_reason == "stop" for o in final for c in o.outputs)  # (a stop string did end one)
    for i, out in enumerate(final):
        want = streamed[str(i)]
        assert [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs] == \
               [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in want.outputs]
        assert [c.logprobs for c in out.outputs] == [c.logprobs for c in want.outputs]
