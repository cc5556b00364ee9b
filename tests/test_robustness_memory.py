"""A long-running engine keeps flat memory: it forgets a request once its final output is out,
keeps a bounded window of per-step stats (while `summary()` still totals the whole run), and its
queries (`has_unfinished_requests`) change nothing. The soak program (`python -m
inflight.bench.offline.soak`) shows the same over 100,000 requests; this is its small, fast version."""
from __future__ import annotations

import random

import pytest
import torch

from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams
from inflight.model.llama import LlamaConfig, LlamaModel

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, eos_token_id=0)
    return LlamaModel(cfg).eval()


def _sizes(engine: LLMEngine) -> dict:
    sched = engine.scheduler
    return {"requests": len(engine.requests), "stats": len(engine.stats), "undelivered": len(engine._undelivered),
            "queues": len(sched.waiting) + len(sched.running) + len(sched.swapped),
            "events": sum(len(x) for x in (sched.events.reaped, sched.events.admitted, sched.events.preempted))}


def test_containers_stay_bounded_over_thousands_of_requests(model):
    rng = random.Random(0)
    engine = LLMEngine(model, block_size=4, num_blocks=48, max_batch_size=16, stats_window=200,
                       enable_prefix_caching=True)
    n, done, peak = 3000, 0, {}
    for i in range(n):
        engine.add_request([rng.randrange(1, 32) for _ in range(rng.randint(1, 8))],
                           SamplingParams(max_tokens=rng.randint(1, 4), ignore_eos=True,
                                          temperature=rng.choice([0.0, 0.8]), seed=rng.choice([None, i])))
        if i % 4 == 3:  # arrivals faster than a step's worth: a queue builds up, then drains
            done += sum(o.finished for o in engine.step())
            for k, v in _sizes(engine).items():
                peak[k] = max(peak.get(k, 0), v)
    while engine.has_unfinished_requests():
        done += sum(o.finished for o in engine.step())
    assert done == n and not engine.requests and engine.allocator.num_free == engine.num_blocks
    assert peak["stats"] == 200, peak                       # a window, not a log
    assert peak["requests"] <= peak["queues"] <= 40, peak   # only the unfinished ones are held, not all 3000
    summary = engine.summary()
    assert summary["finished_requests"] == n and summary["steps"] > 200  # totals cover the whole run


def test_has_unfinished_requests_is_a_pure_query(model):
    engine = LLMEngine(model, block_size=4, num_blocks=16, max_batch_size=4, debug=True)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    engine.add_request([4, 5], SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()
    engine.step()  # the first request has ended: its blocks are held until the next step's reap
    sched = engine.scheduler
    before = (engine.allocator.num_free, len(sched.running), len(engine.requests), len(engine.stats))
    for _ in range(3):
        assert engine.has_unfinished_requests()
    assert (engine.allocator.num_free, len(sched.running), len(engine.requests), len(engine.stats)) == before
    while engine.has_unfinished_requests():
        engine.step()
    # the step that left nothing to do reaped at once: an idle engine holds no blocks
    assert engine.allocator.num_free == engine.num_blocks and not sched.running


def test_final_outputs_of_requests_that_end_inside_generate_come_from_the_next_step(model):
    engine = LLMEngine(model, block_size=4, num_blocks=32, max_batch_size=4, debug=True)
    streamed = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    outs = engine.generate([[4, 5, 6]], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert len(outs[0].token_ids) == 6
    assert engine.has_unfinished_requests()  # the streamed request's final output is still to be returned
    final = [o for o in engine.step() if o.request_id == streamed]
    assert final and final[0].finished and len(final[0].token_ids) == 2
    assert not engine.has_unfinished_requests() and not engine.requests


def test_stats_window_none_keeps_every_step(model):
    engine = LLMEngine(model, block_size=4, num_blocks=16, stats_window=None)
    engine.generate([[1, 2]] * 3, SamplingParams(max_tokens=30, ignore_eos=True), use_tqdm=False)
    assert len(engine.stats) == engine.summary()["steps"] > 30
