"""Prefill/decode disaggregation in one process (`inflight.engine.kv_transfer`): a prefill engine
runs each prompt with max_tokens=1 and ships its KV; a decode engine (its own pool, other block
ids) takes the payload and decodes on. Greedy tokens must be those one engine gives doing both;
the payload survives its byte framing; bad payloads are refused and change nothing."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from inflight import LLMEngine, SamplingParams, load_tiny
from inflight.engine.kv_transfer import KVPayload, QueueConnector, extract_kv, insert_kv
from inflight.model.kv_cache import KVCache, kv_bytes_per_token

PROMPTS = ["def add(a, b):\n    return", "class Stack:\n    def push(self, x):\n        self.items.append(x)\n" * 3,
           "import os\nfor name in os.listdir(path):", "x" * 37]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def _disaggregated(tiny, prompts, max_tokens, *, decode_kw=None, via_bytes=True):
    model, tok = tiny
    conn = QueueConnector()
    prefill = LLMEngine(model, tokenizer=tok, block_size=16, num_blocks=64, kv_connector=conn, debug=True)
    firsts = prefill.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert len(conn.sent) == len(prompts)
    decode = LLMEngine(model, tokenizer=tok, block_size=16, debug=True, **(decode_kw or {"num_blocks": 80}))
    decode.generate(["warm the pool up: other block ids"], SamplingParams(max_tokens=5), use_tqdm=False)
    ids = {}
    for p in conn.sent:
        payload = KVPayload.from_bytes(p.to_bytes()) if via_bytes else p
        ids[decode.add_prefilled_request(payload, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                 ignore_eos=True))] = p.request_id
    outs = {}
    while decode.has_unfinished_requests():
        for o in decode.step():
            if o.finished:
                outs[ids[o.request_id]] = o
    by_id = {f.request_id: f for f in firsts}
    return [outs[f.request_id] for f in firsts], by_id, conn


@pytest.mark.parametrize("decode_kw", [{"num_blocks": 80}, {"num_blocks": 80, "enable_prefix_caching": True},
                                       {"num_blocks": 24, "max_batch_size": 2},
                                       # the decode side speculating (chapter 12): the same tokens
                                       {"num_blocks": 80, "speculative_config": {"method": "ngram",
                                                                                 "num_speculative_tokens": 3}},
                                       {"num_blocks": 80, "speculative_config": {"method": "draft_model",
                                                                                 "model": "inflight-tiny-draft",
                                                                                 "num_speculative_tokens": 3}}])
def test_greedy_tokens_identical_to_one_engine(tiny, decode_kw):
    model, tok = tiny
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    want = LLMEngine(model, tokenizer=tok, block_size=16, num_blocks=64).generate(PROMPTS, params, use_tqdm=False)
    got, firsts, _ = _disaggregated(tiny, PROMPTS, 20, decode_kw=decode_kw)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
        assert g.text == w.text and g.finish_reason == "length"
    for w, g in zip(want, firsts.values()):
        assert g.token_ids == w.token_ids[:1]


def test_payload_bytes_and_framing(tiny):
    model, _ = tiny
    _, _, conn = _disaggregated(tiny, PROMPTS[:1], 3)
    p = conn.sent[0]
    cfg = model.config
    assert p.nbytes == p.num_tokens * kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                                           torch.float32)
    q = KVPayload.from_bytes(p.to_bytes())
    assert q.prompt_token_ids == p.prompt_token_ids and q.output_token_ids == p.output_token_ids
    assert all(torch.equal(a, b) for a, b in zip(p.k + p.v, q.k + q.v))
    with pytest.raises(ValueError, match="expected"):
        KVPayload.from_bytes(p.to_bytes()[:-4])


def test_extract_insert_round_trip_across_block_tables():
    kv_a = KVCache(2, 2, 8, 10, 4)
    kv_b = KVCache(2, 2, 8, 10, 4)
    for t in kv_a.k_cache + kv_a.v_cache:
        t.copy_(torch.randn_like(t))
    k, v = extract_kv(kv_a, [7, 2, 5], 10)
    insert_kv(kv_b, [1, 9, 3], k, v)
    k2, v2 = extract_kv(kv_b, [1, 9, 3], 10)
    assert all(torch.equal(a, b) for a, b in zip(k + v, k2 + v2))
    with pytest.raises(ValueError):
        insert_kv(KVCache(3, 2, 8, 10, 4), [0, 1, 2], k, v)


def test_bad_payload_refused_and_nothing_changes(tiny):
    model, tok = tiny
    _, _, conn = _disaggregated(tiny, PROMPTS[:1], 3)
    p = conn.sent[0]
    decode = LLMEngine(model, tokenizer=tok, block_size=16, num_blocks=40, debug=True)
    short = dataclasses.replace(p, k=[t[:-1] for t in p.k], v=[t[:-1] for t in p.v])
    for bad, err in ((short, ValueError), ("not a payload", TypeError),
                     (dataclasses.replace(p, output_token_ids=[]), ValueError),
                     (dataclasses.replace(p, output_token_ids=[10_000]), ValueError)):
        with pytest.raises(err):
            decode.add_prefilled_request(bad, SamplingParams(max_tokens=4))
    assert not decode.has_unfinished_requests() and not decode.requests


def test_abort_before_admission_and_finish_at_admission(tiny):
    model, tok = tiny
    _, _, conn = _disaggregated(tiny, PROMPTS[:2], 3)
    decode = LLMEngine(model, tokenizer=tok, block_size=16, num_blocks=40, debug=True)
    a = decode.add_prefilled_request(conn.sent[0], SamplingParams(max_tokens=4, ignore_eos=True))
    decode.abort_request(a)
    assert not decode.has_unfinished_requests()
    b = decode.add_prefilled_request(conn.sent[1], SamplingParams(max_tokens=1))  # done with its first token
    outs = decode.step()
    assert [o.request_id for o in outs] == [b] and outs[0].finished and len(outs[0].token_ids) == 1
    decode.step()
    assert decode.allocator.num_used == 0


def test_prefill_and_decode_processes_give_one_engines_tokens(tiny, tmp_path):
    """`python -m inflight.serve.disagg` as processes: the prefill engine pushes each prompt's KV to
    the decode engine over loopback TCP; the client's tokens are one engine's, the KV bytes per token
    the model's; both processes stopped by their PIDs."""
    from inflight.bench.serve.disagg import BOS, MixedRequest, run_arrangement, start_role

    reqs = [MixedRequest("long_prompt", [BOS, *b"def add(a, b):\n    return"], 6, 0.0),
            MixedRequest("long_output", [BOS, *b"class Stack:\n    def push(self, x):"], 12, 0.05),
            MixedRequest("long_output", [BOS, *b"import os\n"], 1, 0.1)]  # done with its first token
    procs = []
    try:
        procs.append(start_role("decode", ["--threads", "1", "--num-blocks", "64"], tmp_path))
        procs.append(start_role("prefill", ["--threads", "1", "--num-blocks", "64", "--decode",
                                            "%s:%d" % procs[0].addr], tmp_path))
        seen = run_arrangement("disaggregated", {"decode": procs[0].addr, "prefill": procs[1].addr}, reqs)
    finally:
        for p in procs:
            p.stop()
    assert all(p.proc.poll() is not None for p in procs)
    assert [s.error for s in seen] == ["", "", ""]
    model, tok = tiny
    want = LLMEngine(model, tokenizer=tok, num_blocks=64).generate(
        [r.prompt_token_ids for r in reqs],
        [SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True) for r in reqs], use_tqdm=False)
    assert [s.tokens for s in seen] == [w.token_ids for w in want]
    cfg = model.config
    per_token = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32)
    assert seen[0].kv_bytes == len(reqs[0].prompt_token_ids) * per_token
