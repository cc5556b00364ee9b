"""Speculative decoding (`inflight.engine.spec_decode`, chapter 12): greedy outputs are token-for-token
those of the engine without it — over fuzzed workloads, under preemption by recompute and by swap,
with chunked prefill, prefix caching, stop tokens and strings, max_tokens, aborts, n > 1 and
log-probabilities — and sampled outputs have the target model's distribution (chi-square tests at a
stated significance level). Every engine here runs with debug=True: the scheduler's invariants
(blocks held == blocks its computed tokens need, nothing leaked) are checked after every step."""
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams
from inflight.engine.spec_decode import SpeculativeConfig, expected_tokens_per_step, ngram_propose
from inflight.engine.spec_decode.rejection_sampler import rejection_sample, target_probs
from inflight.model.llama import LlamaConfig, LlamaModel

torch.set_num_threads(1)
VOCAB = 61


@pytest.fixture(scope="module")
def draft():
    """Another random model of the same vocabulary: a poor draft, so that rejections are common."""
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, eos_token_id=0)
    return LlamaModel(cfg).eval()


def _prompts(n, seed, lo=1, hi=30, repeat=False):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(1, VOCAB) for _ in range(rng.randint(lo, hi))]
        out.append(p * 3 if repeat else p)  # (repeats give the n-gram proposer matches)
    return out


def _specs(draft, k=3):
    return {"ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
            "draft": {"method": "draft_model", "model": draft, "num_speculative_tokens": k}}


def _reference(model, prompts, params, **kw):
    return [o for o in LLMEngine(model, block_size=4, num_blocks=128, debug=True, **kw).generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("prefix", [False, True])
def test_greedy_identical_under_memory_pressure(model, draft, method, preemption, prefix):
    prompts = _prompts(12, seed=1, repeat=True, hi=12)
    prompts += [prompts[0][:20] + p for p in _prompts(4, seed=9, hi=8)]  # shared prefixes
    rng = random.Random(2)
    params = [SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=rng.random() < 0.5) for _ in prompts]
    ref = _reference(model, prompts, params)
    engine = LLMEngine(model, block_size=4, num_blocks=24, max_batch_size=8, max_batched_tokens=24, preemption=preemption,
                       enable_prefix_caching=prefix, debug=True, speculative_config=_specs(draft)[method])
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in ref]
    s = engine.summary()
    assert s["preemptions"] >= 3, "the pool should be small enough to force preemptions"
    assert s["spec_num_draft_tokens"] > 0 and s["spec_num_accepted_tokens"] > 0
    assert engine.allocator.num_free == engine.num_blocks
    assert engine.speculator is not None and engine.speculator.k == 3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), k=st.integers(1, 6), block_size=st.integers(1, 6), extra=st.integers(0, 16),
       batch=st.integers(1, 6), chunked=st.booleans(), prefix=st.booleans(), swap=st.booleans(),
       method=st.sampled_from(["ngram", "draft"]), tokens=st.integers(8, 40))
def test_fuzzed_workloads_greedy_identical(model, draft, seed, k, block_size, extra, batch, chunked, prefix, swap,
                                           method, tokens):
    rng = random.Random(seed)
    prompts = _prompts(rng.randint(1, 8), seed, hi=14, repeat=rng.random() < 0.5)
    params = [SamplingParams(max_tokens=rng.randint(1, 20), ignore_eos=rng.random() < 0.7,
                             stop_token_ids=[rng.randrange(1, VOCAB)] if rng.random() < 0.3 else [])
              for _ in prompts]
    longest = max(len(p) + sp.max_tokens for p, sp in zip(prompts, params))
    num_blocks = -(-longest // block_size) + extra
    kw = dict(block_size=block_size, num_blocks=num_blocks, max_batch_size=batch,
              max_batched_tokens=max(tokens, batch) if chunked else max(longest, batch),
              enable_chunked_prefill=chunked, enable_prefix_caching=prefix, preemption="swap" if swap else "recompute",
              debug=True)
    ref = [o.token_ids for o in LLMEngine(model, **kw).generate(prompts, params, use_tqdm=False)]
    engine = LLMEngine(model, speculative_config=_specs(draft, k)[method], **kw)
    assert [o.token_ids for o in engine.generate(prompts, params, use_tqdm=False)] == ref
    assert engine.allocator.num_free == engine.num_blocks


def test_aborts_mid_speculation_leave_the_rest_identical(model, draft):
    prompts = _prompts(6, seed=3, repeat=True, hi=10)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    ref = [o.token_ids for o in _reference(model, prompts, params)]
    for spec in _specs(draft, 4).values():
        engine = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=4, debug=True, speculative_config=spec)
        ids = [engine.add_request(p, params) for p in prompts]
        final, steps = {}, 0
        while engine.has_unfinished_requests():
            steps += 1
            if steps == 4:
                engine.abort_request(ids[1])
                engine.abort_request(ids[4])  # (still waiting, or running)
            final.update((o.request_id, o) for o in engine.step() if o.finished)
        for i, rid in enumerate(ids):
            if i in (1, 4):
                assert final.get(rid) is None or final[rid].finish_reason == "abort"
            else:
                assert final[rid].token_ids == ref[i]
        assert engine.allocator.num_free == engine.num_blocks


def test_logprobs_and_n_samples_with_speculation(model, draft):
    prompts = _prompts(5, seed=4, repeat=True, hi=10)
    greedy = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=3)
    ref = _reference(model, prompts, greedy)
    for spec in _specs(draft, 3).values():
        outs = LLMEngine(model, block_size=4, num_blocks=64, debug=True, speculative_config=spec).generate(
            prompts, greedy, use_tqdm=False)
        for o, r in zip(outs, ref):
            assert o.token_ids == r.token_ids
            got, want = o.outputs[0].logprobs, r.outputs[0].logprobs
            assert len(got) == len(want) == len(o.token_ids)
            for a, b in zip(got, want):  # the target's own distribution at each accepted position
                assert list(a) == list(b)
                assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 and a[t].rank == b[t].rank for t in a)
            assert abs(o.outputs[0].cumulative_logprob - r.outputs[0].cumulative_logprob) < 1e-3
        # n > 1: every sample is its own sequence after the fork, sharing the prompt's blocks (copy-on-write)
        engine = LLMEngine(model, block_size=4, num_blocks=64, debug=True, speculative_config=spec)
        outs = engine.generate(prompts, SamplingParams(n=3, temperature=0.9, max_tokens=12, seed=5, ignore_eos=True,
                                                       logprobs=1), use_tqdm=False)
        for o in outs:
            assert len(o.outputs) == 3
            for c in o.outputs:
                assert len(c.token_ids) == 12 and len(c.logprobs) == 12
        assert engine.spec_decode_stats()["spec_num_drafts"] > 0
        assert engine.allocator.num_free == engine.num_blocks


def test_stop_strings_end_at_the_same_token(tiny):
    model, tok = tiny
    prompts = ["def fibonacci(n):\n", "class Stack:\n    def push(self, item):\n", "import os\n\ndef walk(path):\n"]
    for stop in (["return"], ["self._", "\n\n"], ["):"]):
        params = SamplingParams(max_tokens=80, stop=stop)
        ref = LLMEngine(model, tokenizer=tok, debug=True).generate(prompts, params, use_tqdm=False)
        for spec in ({"method": "ngram", "num_speculative_tokens": 5},
                     {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}):
            outs = LLMEngine(model, tokenizer=tok, debug=True, speculative_config=spec).generate(
                prompts, params, use_tqdm=False)
            assert [(o.token_ids, o.text, o.finish_reason, o.outputs[0].stop_reason) for o in outs] == \
                   [(o.token_ids, o.text, o.finish_reason, o.outputs[0].stop_reason) for o in ref]


def test_bad_speculative_configs_are_refused_before_anything_runs(model):
    bad = [({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
           ({"method": "ngram"}, "num_speculative_tokens"),
           ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
           ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min"),
           ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min"),
           ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "unknown"),
           ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
           ({"method": "draft_model", "num_speculative_tokens": 2, "model": "/nonexistent/draft"}, "does not load"),
           ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens")]
    for cfg, word in bad:
        with pytest.raises((ValueError, TypeError), match=word):
            LLMEngine(model, speculative_config=cfg)
    other = LlamaModel(LlamaConfig(vocab_size=VOCAB + 1, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128))
    with pytest.raises(ValueError, match="vocabulary"):
        LLMEngine(model, speculative_config={"method": "draft_model", "model": other, "num_speculative_tokens": 2})
    with pytest.raises(TypeError):
        LLMEngine(model, speculative_config="ngram")


def test_ngram_proposer():
    assert ngram_propose([1, 2, 3, 4, 1, 2], 2, 1, 3) == [3, 4]
    assert ngram_propose([1, 2, 3, 4, 1, 2], 5, 1, 3) == [3, 4, 1, 2]
    assert ngram_propose([5, 1, 2, 9, 3, 1, 2], 1, 2, 2) == [9]   # the latest occurrence of the 2-gram
    assert ngram_propose([1, 2, 3], 3, 1, 3) == []                 # no earlier occurrence
    assert ngram_propose([7, 7], 3, 1, 1) == [7]
    assert ngram_propose([1, 2, 1, 3, 2, 1], 2, 1, 3) == [3, 2]    # longest match (2, 1) wins over 1 alone


def test_expected_tokens_per_step():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert abs(expected_tokens_per_step(0.5, 2) - 1.75) < 1e-12


# -- the distribution: chi-square goodness of fit at significance 0.001 --------------------------------
ALPHA = 0.001
Z = 3.090232  # the standard normal's upper 0.001 quantile


def _chi2_critical(df):
    """The chi-square upper-ALPHA quantile (Wilson-Hilferty: within 1% for df >= 3)."""
    return df * (1 - 2 / (9 * df) + Z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(counts, probs, n):
    """Chi-square statistic and degrees of freedom, cells of expected count < 5 pooled into one."""
    stat, df, pool_o, pool_e = 0.0, -1, 0, 0.0
    for cell, p in probs.items():
        e, o = n * p, counts.get(cell, 0)
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            stat, df = stat + (o - e) ** 2 / e, df + 1
    if pool_e > 0:
        stat, df = stat + (pool_o - pool_e) ** 2 / max(pool_e, 1e-12), df + 1
    assert sum(counts.values()) == n and all(c in probs for c in counts), "a sample outside the support"
    return stat, df


def test_rejection_rule_keeps_the_target_distribution_for_any_draft():
    """The rule alone, with a non-degenerate q: the first emitted token is distributed as p."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 8, generator=g) * 1.5
    q = torch.softmax(torch.randn(2, 8, generator=g), -1)
    p = target_probs(logits, 1.0)
    n, counts = 20_000, {}
    for _ in range(n):
        x = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
        out = rejection_sample(logits, x, 1.0, 1.0, lambda: torch.rand(1, generator=g, dtype=torch.float64).item(), q)
        counts[out[0]] = counts.get(out[0], 0) + 1
    stat, df = _chi2(counts, dict(enumerate(p[0].tolist())), n)
    assert stat < _chi2_critical(df), f"chi-square {stat:.1f} on {df} df: not the target's distribution"


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_sampled_text_has_the_target_distribution(method):
    """Three sampled tokens of a 6-token model: the engine's joint frequencies against the exact
    probabilities from the model's logits (216 cells), speculation on (a poor draft: many rejections)."""
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=6, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32, eos_token_id=0)
    target = LlamaModel(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)  # (peaked distributions: proposals are accepted often, not always)
    draft = LlamaModel(cfg).eval()  # the target, perturbed: a draft that is often right, not always
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for w in draft.parameters():
            w.add_(torch.randn_like(w) * 0.3 * w.std())
    prompt, temp = [1, 2, 1, 2, 1], 0.9
    probs = {}
    with torch.no_grad():
        seqs = [[]]
        for _ in range(3):
            ctx = torch.tensor([prompt + s for s in seqs])
            p = torch.softmax(target.forward_dense(ctx)[:, -1].double() / temp, -1)
            seqs = [s + [t] for s in seqs for t in range(6)]
            if not probs:
                probs = {(t,): p[0, t].item() for t in range(6)}
            else:
                probs = {c + (t,): probs[c] * p[i, t].item() for i, c in enumerate(probs) for t in range(6)}
    spec = {"method": "ngram", "num_speculative_tokens": 2} if method == "ngram" else \
        {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    n = 6000
    engine = LLMEngine(target, block_size=4, max_batch_size=64, speculative_config=spec)
    outs = engine.generate([prompt] * n, [SamplingParams(temperature=temp, max_tokens=3, ignore_eos=True, seed=i)
                                          for i in range(n)], use_tqdm=False)
    counts = {}
    for o in outs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    stats = engine.spec_decode_stats()
    assert 0.1 < stats["spec_acceptance_rate"] < 0.95, stats  # both branches of the rule were taken
    stat, df = _chi2(counts, probs, n)
    assert stat < _chi2_critical(df), f"chi-square {stat:.1f} on {df} df (critical {_chi2_critical(df):.1f})"


def test_config_parse_defaults():
    c = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (1, 3)
    c = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    assert SpeculativeConfig.parse(None) is None


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_n_samples_under_memory_pressure_with_speculation(model, draft, preemption):
    """Samples sharing a prompt's blocks (copy-on-write), preempted and resumed, speculating: every
    sample completes, the invariants hold after every step (debug), nothing leaks; and a seeded run
    is the same run to run."""
    prompts = _prompts(4, seed=6, repeat=True, hi=8)
    params = SamplingParams(n=3, temperature=0.8, top_p=0.9, max_tokens=14, seed=3, ignore_eos=True, logprobs=0)
    runs = []
    for _ in range(2):
        for spec in _specs(draft, 3).values():
            engine = LLMEngine(model, block_size=4, num_blocks=22, max_batch_size=6, preemption=preemption, debug=True,
                               speculative_config=spec)
            outs = engine.generate(prompts, params, use_tqdm=False)
            assert all(len(c.token_ids) == 14 and len(c.logprobs) == 14 for o in outs for c in o.outputs)
            assert engine.summary()["preemptions"] > 0 and engine.spec_decode_stats()["spec_num_drafts"] > 0
            assert engine.allocator.num_free == engine.num_blocks
            runs.append([[c.token_ids for c in o.outputs] for o in outs])
    assert runs[:2] == runs[2:]
