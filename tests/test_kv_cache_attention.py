"""Paged KV cache layout, slot mapping, and the reference paged attention against a naive loop."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.model import attention as attn
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache, kv_bytes_per_token, num_blocks_for_budget
from inflight.model.llama import LlamaConfig


def test_build_slots_positions_offsets():
    meta = AttentionMetadata.build(query_lens=[3, 1], context_lens=[3, 6], block_tables=[[7, 2], [4, 0, 9]],
                                   block_size=4)
    assert meta.query_start_loc.tolist() == [0, 3, 4]
    assert meta.positions.tolist() == [0, 1, 2, 5]
    # slot = block_table[p // bs] * bs + p % bs
    assert meta.slot_mapping.tolist() == [28, 29, 30, 0 * 4 + 1]
    assert meta.block_tables.tolist() == [[7, 2, 0], [4, 0, 9]]
    assert meta.context_lens.dtype == torch.int32 and meta.block_tables.dtype == torch.int32
    assert (meta.max_query_len, meta.max_context_len, meta.is_decode) == (3, 6, False)
    assert AttentionMetadata.build([1, 1], [5, 2], [[0, 1], [2]], 4).is_decode


@pytest.mark.parametrize("kwargs, match", [
    (dict(query_lens=[2], context_lens=[1], block_tables=[[0]]), "context_len 1 < query_len 2"),
    (dict(query_lens=[0], context_lens=[1], block_tables=[[0]]), "query_len must be >= 1"),
    (dict(query_lens=[1], context_lens=[9], block_tables=[[0, 1]]), "need 3 blocks"),
    (dict(query_lens=[1, 1], context_lens=[1], block_tables=[[0]]), "one entry per sequence"),
    (dict(query_lens=[], context_lens=[], block_tables=[]), "empty batch"),
])
def test_build_rejects_bad_batches(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionMetadata.build(block_size=4, **kwargs)


def test_kv_cache_shapes_and_sizes():
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    cache = KVCache.for_model(cfg, num_blocks=5, block_size=8, dtype=torch.float16)
    assert len(cache.k_cache) == len(cache.v_cache) == 3
    assert cache.k_cache[0].shape == (5, 8, 2, 16)
    assert cache.bytes_per_token == 2 * 3 * 2 * 16 * 2 == kv_bytes_per_token(3, 2, 16, torch.float16)
    assert cache.bytes_per_block == cache.bytes_per_token * 8
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in cache.k_cache + cache.v_cache)
    assert num_blocks_for_budget(cache.bytes_per_token, 8, 10 * cache.bytes_per_block + 1) == 10
    sized = KVCache.from_memory_budget(cfg, block_size=8, budget_bytes=4 * cache.bytes_per_block, dtype=torch.float16)
    assert sized.num_blocks == 4
    with pytest.raises(ValueError, match="holds no block"):
        KVCache.from_memory_budget(cfg, block_size=8, budget_bytes=10)
    with pytest.raises(ValueError, match="num_blocks"):
        KVCache(1, 1, 4, 0, 4)


def test_write_kv_scatters_by_slot():
    k_cache, v_cache = torch.zeros(3, 2, 1, 2), torch.zeros(3, 2, 1, 2)
    k = torch.arange(6.0).view(3, 1, 2)
    attn.write_kv(k_cache, v_cache, k, -k, torch.tensor([5, 0, 2]))
    assert torch.equal(k_cache.view(6, 1, 2)[[5, 0, 2]], k)
    assert torch.equal(v_cache.view(6, 1, 2)[[5, 0, 2]], -k)
    assert k_cache.view(6, 1, 2)[[1, 3, 4]].abs().sum() == 0


def _naive(q, k_cache, v_cache, meta, scale):
    """Per-sequence, per-token loop with an explicit softmax: the definition of the answer."""
    bs, kvh = k_cache.shape[1], k_cache.shape[2]
    H = q.shape[1]
    out = torch.empty_like(q)
    starts = meta.query_start_loc.tolist()
    for s, ctx in enumerate(meta.context_lens.tolist()):
        table = meta.block_tables[s].tolist()
        slots = [table[p // bs] * bs + p % bs for p in range(ctx)]
        K = k_cache.view(-1, kvh, k_cache.shape[-1])[slots]  # [ctx, kvh, D]
        V = v_cache.view(-1, kvh, v_cache.shape[-1])[slots]
        ql = starts[s + 1] - starts[s]
        for j in range(ql):
            pos = ctx - ql + j
            for h in range(H):
                kh = h // (H // kvh)
                w = torch.softmax((K[: pos + 1, kh] @ q[starts[s] + j, h]) * scale, 0)
                out[starts[s] + j, h] = w @ V[: pos + 1, kh]
    return out


def _random_batch(gen, query_lens, context_lens, block_size, kvh, g, D):
    need = [-(-c // block_size) for c in context_lens]
    n_blocks = sum(need) + 2
    perm = torch.randperm(n_blocks, generator=gen).tolist()
    tables, k = [], 0
    for n in need:
        tables.append(perm[k:k + n])
        k += n
    meta = AttentionMetadata.build(query_lens, context_lens, tables, block_size)
    k_cache = torch.randn(n_blocks, block_size, kvh, D, generator=gen)
    v_cache = torch.randn(n_blocks, block_size, kvh, D, generator=gen)
    q = torch.randn(sum(query_lens), kvh * g, D, generator=gen)
    return q, k_cache, v_cache, meta


@settings(max_examples=25, deadline=None)
@given(data=st.data(), block_size=st.sampled_from([1, 2, 5, 16]), kvh=st.sampled_from([1, 2]),
       g=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_reference_matches_naive_on_random_ragged_batches(data, block_size, kvh, g, seed):
    n = data.draw(st.integers(1, 4))
    ctx = data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    ql = [data.draw(st.integers(1, c)) for c in ctx]
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(seed), ql, ctx, block_size, kvh, g, 8)
    scale = 1 / math.sqrt(8)
    torch.testing.assert_close(attn.paged_attention(q, kc, vc, meta, scale), _naive(q, kc, vc, meta, scale),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_decode_batch_matches_naive_on_cpu_with_either_implementation(block_size):
    from inflight.model import cpu_attention

    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(0), [1] * 6, [1, 7, 33, 16, 2, 20], block_size, 2, 4, 16)
    for name in ("auto", "torch"):
        backend = attn.AttentionBackend(name)
        out = backend(q, kc, vc, meta, 0.25)
        # "auto" on a CPU: the C kernel where it builds, else the reference
        want = "c" if name == "auto" and cpu_attention.load() is not None else "torch"
        assert backend.last_used == want
        torch.testing.assert_close(out, _naive(q, kc, vc, meta, 0.25), atol=1e-5, rtol=1e-5)


def test_decode_pattern_lists_each_query_rows_own_cache_rows():
    # two decodes (contexts 3 and 2, blocks of 2) and a prefill chunk; 4 query heads over 2 kv heads
    meta = AttentionMetadata.build([1, 3, 1], [3, 3, 2], [[5, 1], [0, 2], [3]], block_size=2)
    pat = meta.decode_pattern(num_heads=4, num_kv_heads=2)
    assert pat.rows.tolist() == [0, 4] and not pat.in_batch_order
    slots = [[10, 11, 2], [6, 7]]  # block_table[p // 2] * 2 + p % 2
    want = [[s * 2 + h // 2 for s in seq] for seq in slots for h in range(4)]  # cache row = slot * kv_heads + kv head
    assert pat.lengths.tolist() == [len(w) for w in want]
    assert [pat.cols[a:b].tolist() for a, b in zip(pat.crow[:-1].tolist(), pat.crow[1:].tolist())] == want
    assert meta.decode_pattern(4, 2) is pat  # built once per step, shared by every layer
    assert AttentionMetadata.build([2], [2], [[0]], 2).decode_pattern(4, 2) is None


@pytest.mark.parametrize("with_prefill", [False, True])
def test_many_decodes_of_long_tailed_lengths_match_naive(with_prefill):
    gen = torch.Generator().manual_seed(3)
    ctx = [int(c) for c in torch.randint(1, 300, (40,), generator=gen)]
    ql = [1] * 40
    if with_prefill:  # a prompt chunk in the middle of the batch and a later chunk of another prompt
        ql[7], ctx[7] = 30, 30
        ql[21], ctx[21] = 9, 57
    q, kc, vc, meta = _random_batch(gen, ql, ctx, 16, 2, 2, 8)
    torch.testing.assert_close(attn.paged_attention(q, kc, vc, meta, 0.3), _naive(q, kc, vc, meta, 0.3),
                               atol=1e-5, rtol=1e-5)


def test_half_precision_reference_matches_naive():
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(2), [1, 4, 1], [9, 6, 23], 4, 2, 2, 16)
    q, kc, vc = q.bfloat16(), kc.bfloat16(), vc.bfloat16()
    out = attn.paged_attention(q, kc, vc, meta, 0.25)
    assert out.dtype == torch.bfloat16
    want = _naive(q.float(), kc.float(), vc.float(), meta, 0.25)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_a_failing_kernel_falls_back_to_the_reference_once_and_for_all(monkeypatch):
    calls = []

    def broken_kernel(*args):
        calls.append(1)
        raise RuntimeError("no compiler for this GPU")

    monkeypatch.setattr(attn, "_kernel_device", lambda q: True)
    monkeypatch.setattr(attn, "_load_triton_decode", lambda: broken_kernel)
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(4), [1, 1], [5, 9], 4, 1, 2, 8)
    backend = attn.AttentionBackend()
    with pytest.warns(RuntimeWarning, match="no compiler"):
        out = backend(q, kc, vc, meta, 0.5)
    assert backend.last_used == "torch" and "no compiler" in backend.kernel_error
    torch.testing.assert_close(out, _naive(q, kc, vc, meta, 0.5), atol=1e-5, rtol=1e-5)
    backend(q, kc, vc, meta, 0.5)
    assert len(calls) == 1  # not tried again by this backend ...
    with pytest.warns(RuntimeWarning):
        attn.AttentionBackend()(q, kc, vc, meta, 0.5)
    assert len(calls) == 2  # ... while another model's backend keeps its own state


def test_mixed_batch_sends_its_decodes_to_the_kernel(monkeypatch):
    """Where the kernel runs (CUDA), a mixed prefill/decode step still gives all its decodes to it."""
    calls = []

    def fake_kernel(q, k_cache, v_cache, block_tables, context_lens, scale):
        calls.append(context_lens.tolist())
        lens = context_lens.tolist()
        tables = [row[: -(-c // k_cache.shape[1])] for row, c in zip(block_tables.tolist(), lens)]
        meta = AttentionMetadata.build([1] * len(lens), lens, tables, k_cache.shape[1])
        return _naive(q, k_cache, v_cache, meta, scale)

    monkeypatch.setattr(attn, "_kernel_device", lambda q: True)
    monkeypatch.setattr(attn, "_load_triton_decode", lambda: fake_kernel)
    ql, ctx = [1, 5, 1, 1, 7], [9, 12, 3, 30, 7]
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(1), ql, ctx, 4, 2, 3, 8)
    backend = attn.AttentionBackend()
    out = backend(q, kc, vc, meta, 0.3)
    assert calls == [[9, 3, 30]]  # one kernel call with every decode, none with a prefill chunk
    assert backend.last_used == "triton"
    torch.testing.assert_close(out, _naive(q, kc, vc, meta, 0.3), atol=1e-5, rtol=1e-5)


def test_dispatcher_rejects_bad_backend_requests():
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(0), [3], [3], 4, 1, 1, 8)
    with pytest.raises(ValueError, match="backend"):
        attn.AttentionBackend("cuda")
    with pytest.raises(RuntimeError, match="decode-only"):
        attn.AttentionBackend("triton")(q, kc, vc, meta, 1.0)
    with pytest.raises(ValueError, match="multiple of"):
        attn.paged_attention(torch.randn(3, 3, 8), kc.expand(-1, -1, 2, -1), vc.expand(-1, -1, 2, -1), meta, 1.0)


def test_default_budget_on_cpu_is_a_capped_share_of_ram():
    from inflight.model.kv_cache import default_kv_budget_bytes

    budget = default_kv_budget_bytes("cpu")
    assert 0 < budget <= 1 << 30
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    cache = KVCache.from_memory_budget(cfg, block_size=16, budget_bytes=None)
    assert cache.nbytes <= budget < cache.nbytes + cache.bytes_per_block
