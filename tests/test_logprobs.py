"""Log-probabilities from the engine (`SamplingParams.logprobs`, `prompt_logprobs`) are the model's:
on a random-weight Llama saved by transformers, every prompt token's log-probability and every
generated token's equals what transformers computes on the same weights (fp32 tolerance) —
through chunked prefill, prefix-cache hits, preemption and parallel samples. They are raw (before
temperature and top-p), the greedy token is the top of its own top-k, and k is bounded."""
import math

import pytest
import torch

from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import MAX_LOGPROBS, SamplingParams

VOCAB = 61
ATOL = 2e-5


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from inflight.model.loading import load_pretrained

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(path)
    return hf, load_pretrained(str(path))


def _hf_logprobs(hf, ids):
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


PROMPT = [5, 17, 33, 2, 9, 41, 8, 8, 60, 1, 23, 7, 44, 12, 3, 30, 19, 52, 6, 11, 27, 38, 14]  # 23 tokens


def _check_prompt(hf, out, k):
    lp = _hf_logprobs(hf, out.prompt_token_ids)
    entries = out.prompt_logprobs
    assert len(entries) == len(out.prompt_token_ids) and entries[0] is None
    for t in range(1, len(entries)):
        tok = out.prompt_token_ids[t]
        e = entries[t]
        assert math.isclose(e[tok].logprob, lp[t - 1, tok].item(), abs_tol=ATOL), t
        assert e[tok].rank == int((lp[t - 1] > lp[t - 1, tok]).sum()) + 1
        top = sorted((x.logprob for x in e.values() if x.rank <= k), reverse=True)  # the top k, the token or not
        assert top == pytest.approx(lp[t - 1].topk(k).values.tolist(), abs=ATOL)


@pytest.mark.parametrize("chunk", [512, 7])
def test_prompt_logprobs_equal_transformers(hf_pair, chunk):
    hf, ours = hf_pair
    engine = LLMEngine(ours, block_size=4, num_blocks=64, max_batch_size=4, max_batched_tokens=chunk, debug=True)
    out = engine.generate([PROMPT], SamplingParams(max_tokens=3, prompt_logprobs=5, ignore_eos=True),
                          use_tqdm=False)[0]
    _check_prompt(hf, out, 5)
    if chunk == 7:
        assert sum(1 for s in engine.stats if s.num_prefill_tokens) >= 4, "the prompt went through in chunks"


def test_generated_logprobs_equal_transformers_and_greedy_is_the_top(hf_pair):
    hf, ours = hf_pair
    engine = LLMEngine(ours, block_size=4, num_blocks=64, debug=True)
    out = engine.generate([PROMPT], SamplingParams(max_tokens=8, logprobs=4, ignore_eos=True), use_tqdm=False)[0]
    lp = _hf_logprobs(hf, PROMPT + out.token_ids)
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 8
    for i, (tok, e) in enumerate(zip(c.token_ids, c.logprobs)):
        row = lp[len(PROMPT) + i - 1]
        assert math.isclose(e[tok].logprob, row[tok].item(), abs_tol=ATOL)
        assert e[tok].rank == 1 and e[tok].logprob == max(x.logprob for x in e.values()), "greedy = top of top-k"
        assert len(e) == 4 and [x.rank for x in e.values()] == [1, 2, 3, 4]
        assert list(e)[1:] == row.topk(4).indices.tolist()[1:]
    assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)))


def test_logprobs_are_raw_whatever_the_temperature(model):
    prompt = [3, 1, 4, 1, 5]
    firsts = []
    for temperature in (0.0, 0.3, 2.0):
        engine = LLMEngine(model, block_size=4, num_blocks=32, debug=True)
        out = engine.generate([prompt], SamplingParams(max_tokens=1, logprobs=5, temperature=temperature, top_p=0.5,
                                                       seed=1, ignore_eos=True), use_tqdm=False)[0]
        e = out.outputs[0].logprobs[0]
        firsts.append(sorted((t, round(x.logprob, 5)) for t, x in e.items() if x.rank <= 5))
    assert firsts[0] == firsts[1] == firsts[2], "the top-5 of the first position does not depend on sampling"


def test_sampled_token_outside_the_top_k_is_listed_with_its_rank(model):
    engine = LLMEngine(model, block_size=4, num_blocks=32, debug=True)
    out = engine.generate([[9, 9, 9]], SamplingParams(max_tokens=40, logprobs=0, temperature=3.0, seed=5,
                                                      ignore_eos=True), use_tqdm=False)[0]
    entries = out.outputs[0].logprobs
    assert all(list(e) == [t] for t, e in zip(out.token_ids, entries)), "logprobs=0: the token's own only"
    assert any(e[t].rank > 1 for t, e in zip(out.token_ids, entries)), "temperature 3 samples unlikely tokens"


def test_prompt_logprobs_through_cache_preemption_and_samples(hf_pair):
    hf, ours = hf_pair
    sp = SamplingParams(max_tokens=12, prompt_logprobs=2, ignore_eos=True, n=2, temperature=1.0, seed=4)
    for preemption in ("recompute", "swap"):
        engine = LLMEngine(ours, block_size=4, num_blocks=20, max_batch_size=6, max_batched_tokens=8,
                           enable_prefix_caching=True, preemption=preemption, debug=True)
        plain = engine.generate([PROMPT], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)[0]
        others = [PROMPT[:9] + [1, 2, 3, 4], [7] * 11]
        outs = engine.generate([PROMPT] + others, [sp, SamplingParams(max_tokens=12, ignore_eos=True, n=3),
                                                   SamplingParams(max_tokens=12, ignore_eos=True)], use_tqdm=False)
        assert plain.num_cached_tokens == 0 and outs[0].num_cached_tokens == 0, "a cached prefix has no logits"
        assert outs[1].num_cached_tokens > 0, "the prompt's blocks are cached for the others all the same"
        assert engine.summary()["preemptions"] > 0
        _check_prompt(hf, outs[0], 2)
        again = engine.generate([PROMPT], SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False)[0]
        assert again.num_cached_tokens > 0


def test_token_texts_come_with_a_tokenizer():
    from inflight.model.loading import load_tiny

    try:
        tiny, tok = load_tiny()
    except FileNotFoundError:
        pytest.skip("the shipped tiny model is not there yet")
    engine = LLMEngine(tiny, tokenizer=tok, block_size=8, num_blocks=32, debug=True)
    out = engine.generate(["The cat sat"], SamplingParams(max_tokens=5, logprobs=2, prompt_logprobs=1),
                          use_tqdm=False)[0]
    for t, e in zip(out.token_ids, out.outputs[0].logprobs):
        assert all(x.decoded_token == tok.decode([u]) for u, x in e.items())
    assert all(x.decoded_token is not None for e in out.prompt_logprobs[1:] for x in e.values())


def test_the_maximum_is_stated_and_enforced():
    assert MAX_LOGPROBS == 20
    SamplingParams(logprobs=20, prompt_logprobs=20)
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"{name} must be <= 20"):
            SamplingParams(**{name: 21})
