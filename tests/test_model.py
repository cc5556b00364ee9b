"""The model matches Hugging Face transformers on the same random weights (fp32, CPU)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from inflight.model.generate import generate
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache
from inflight.model.loading import load_pretrained
from inflight.model.llama import LlamaConfig

ATOL = 1e-4
SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)

VARIANTS = {
    "llama-gqa": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "llama-tied-mha-bias": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                            dict(tie_word_embeddings=True, num_key_value_heads=4, attention_bias=True, rope_theta=500.0)),
    "llama3-rope-scaling": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                            dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "qwen2-bias": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(num_key_value_heads=1)),
}


def _make(tmp_path_factory, name):
    cfg_cls, model_cls, extra = VARIANTS[name]
    torch.manual_seed(0)
    hf = model_cls(cfg_cls(**{**SMALL, **extra})).eval()
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(folder)
    return hf, load_pretrained(folder, device="cpu")


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    return _make(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _make(tmp_path_factory, "llama-gqa")


def _prefill_then_decode(model, ids, n_prefill):
    """Prefill ids[:n_prefill] in one step, then feed the rest one token a step; logits of every step."""
    cache = KVCache.for_model(model.config, num_blocks=1, block_size=len(ids))
    out = []
    meta = AttentionMetadata.build([n_prefill], [n_prefill], [[0]], len(ids))
    out.append(model(torch.tensor(ids[:n_prefill]), meta.positions, meta, cache))
    for p in range(n_prefill, len(ids)):
        meta = AttentionMetadata.build([1], [p + 1], [[0]], len(ids))
        out.append(model(torch.tensor(ids[p:p + 1]), meta.positions, meta, cache))
    return torch.cat(out)


def test_prefill_and_every_decode_step_match_transformers(pair):
    hf, model = pair
    torch.manual_seed(1)
    ids = torch.randint(0, SMALL["vocab_size"], (20,)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        mine = _prefill_then_decode(model, ids, n_prefill=7)
    assert mine.dtype == torch.float32
    torch.testing.assert_close(mine, ref, atol=ATOL, rtol=0)


def test_greedy_matches_transformers_generate_batch(pair):
    hf, model = pair
    torch.manual_seed(2)
    prompts = [torch.randint(1, SMALL["vocab_size"], (n,)).tolist() for n in (3, 9, 1, 14)]
    n_new = 12
    # transformers' batched generate: left padding with an attention mask
    width = max(map(len, prompts))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        ref = hf.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=n_new, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[:, width:].tolist()
    mine = generate(model, prompts, max_new_tokens=n_new, stop_at_eos=False)
    assert mine == ref


def test_ragged_batch_equals_each_request_alone(llama):
    """One step mixing a fresh prefill, a prefill chunk on top of cached tokens and two decodes."""
    _, model = llama
    torch.manual_seed(3)
    V = SMALL["vocab_size"]
    seqs = [torch.randint(0, V, (n,)).tolist() for n in (6, 11, 5, 9)]
    done_before = [0, 4, 4, 8]  # tokens already in the cache before the mixed step
    L = 16
    alone = []
    for s, d in zip(seqs, done_before):  # reference: each request alone, same split
        cache = KVCache.for_model(model.config, 1, L)
        if d:
            m = AttentionMetadata.build([d], [d], [[0]], L)
            model(torch.tensor(s[:d]), m.positions, m, cache)
        m = AttentionMetadata.build([len(s) - d], [len(s)], [[0]], L)
        alone.append(model(torch.tensor(s[d:]), m.positions, m, cache))
    cache = KVCache.for_model(model.config, len(seqs), L)
    for i, (s, d) in enumerate(zip(seqs, done_before)):
        if d:
            m = AttentionMetadata.build([d], [d], [[i]], L)
            model(torch.tensor(s[:d]), m.positions, m, cache)
    meta = AttentionMetadata.build([len(s) - d for s, d in zip(seqs, done_before)], [len(s) for s in seqs],
                                   [[i] for i in range(len(seqs))], L)
    ids = torch.tensor([t for s, d in zip(seqs, done_before) for t in s[d:]])
    batched = model(ids, meta.positions, meta, cache)
    torch.testing.assert_close(batched, torch.cat(alone), atol=1e-5, rtol=0)
    last = meta.query_start_loc[1:].long() - 1
    only_last = model(ids, meta.positions, meta, cache, logits_indices=last)
    torch.testing.assert_close(only_last, batched[last], atol=1e-5, rtol=0)


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_cache_equals_contiguous(llama, block_size):
    """Prefill chunks + decodes through scrambled block tables give the contiguous cache's logits."""
    _, model = llama
    torch.manual_seed(4)
    V, L = SMALL["vocab_size"], 24
    seqs = [torch.randint(0, V, (n,)).tolist() for n in (17, 5, 23)]
    need = [-(-len(s) // block_size) for s in seqs]
    perm = torch.randperm(sum(need) + 3).tolist()  # spare blocks, scrambled order
    tables, k = [], 0
    for n in need:
        tables.append(perm[k:k + n])
        k += n
    paged = KVCache.for_model(model.config, sum(need) + 3, block_size)
    contig = KVCache.for_model(model.config, len(seqs), L)
    pos = [0] * len(seqs)
    chunk = [6, 5, 8]  # first step: prefill chunks of these sizes, then one token per step
    while any(p < len(s) for p, s in zip(pos, seqs)):
        live = [i for i, s in enumerate(seqs) if pos[i] < len(s)]
        q = [min(chunk[i] if pos[i] == 0 else 1, len(seqs[i]) - pos[i]) for i in live]
        ctx = [pos[i] + n for i, n in zip(live, q)]
        ids = torch.tensor([t for i, n in zip(live, q) for t in seqs[i][pos[i]:pos[i] + n]])
        mp = AttentionMetadata.build(q, ctx, [tables[i] for i in live], block_size)
        mc = AttentionMetadata.build(q, ctx, [[i] for i in live], L)
        assert torch.equal(mp.positions, mc.positions)
        torch.testing.assert_close(model(ids, mp.positions, mp, paged), model(ids, mc.positions, mc, contig),
                                   atol=1e-5, rtol=0)
        for i, n in zip(live, q):
            pos[i] += n


def test_forward_rejects_bad_shapes(llama):
    _, model = llama
    cache = KVCache.for_model(model.config, 1, 8)
    meta = AttentionMetadata.build([3], [3], [[0]], 8)
    with pytest.raises(ValueError, match="1-D"):
        model(torch.tensor([[1, 2, 3]]), meta.positions, meta, cache)
    with pytest.raises(ValueError, match="metadata describes 3"):
        model(torch.tensor([1, 2]), meta.positions[:2], meta, cache)


def test_config_rejects_unsupported_rope_and_heads():
    with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
        LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        LlamaConfig(num_attention_heads=4, num_key_value_heads=3)


def test_dense_forward_matches_cached_forward(llama):
    _, model = llama
    ids = torch.arange(10) % SMALL["vocab_size"]
    cache = KVCache.for_model(model.config, 1, 10)
    meta = AttentionMetadata.build([10], [10], [[0]], 10)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_dense(ids[None])[0], model(ids, meta.positions, meta, cache),
                                   atol=1e-5, rtol=0)


def test_static_batch_loop_per_request_limits_kept_rows_and_step_hook(llama):
    """The one static decode loop: per-request max_new_tokens, finished rows kept or dropped (same
    greedy tokens), the step hook seeing every step, and a cache too small refused up front."""
    from inflight.model.generate import decode_static_batch

    _, model = llama
    torch.manual_seed(5)
    prompts = [torch.randint(1, SMALL["vocab_size"], (n,)).tolist() for n in (4, 9, 2)]
    limits = [3, 7, 1]
    mine = generate(model, prompts, max_new_tokens=limits, stop_at_eos=False)
    alone = [generate(model, [p], max_new_tokens=m, stop_at_eos=False)[0] for p, m in zip(prompts, limits)]
    assert mine == alone and [len(o) for o in mine] == limits
    steps = []
    cache = KVCache.for_model(model.config, num_blocks=3, block_size=16)
    kept = decode_static_batch(model, cache, prompts, limits, keep_finished_rows=True,
                               on_step=lambda outs, got, rows: steps.append((list(got), rows)))
    assert kept == mine
    # every row is computed until the longest is done; a row gets tokens only until its own limit
    assert [rows for _, rows in steps] == [3] * 7
    assert [got for got, _ in steps] == [[0, 1, 2], [0, 1], [0, 1], [1], [1], [1], [1]]
    with pytest.raises(ValueError, match="block of 16"):
        decode_static_batch(model, cache, [[1] * 10, [2]], [2, 7], keep_finished_rows=True)
    with pytest.raises(ValueError, match="3 entries for 2 prompts"):
        generate(model, prompts[:2], max_new_tokens=limits)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        generate(model, prompts, max_new_tokens=[1, 0, 2])


@pytest.mark.parametrize("name", ["llama-gqa", "llama3-rope-scaling"])
def test_rope_table_rows_are_the_computed_values_to_the_bit(tmp_path_factory, name):
    """The serving step's cos/sin are looked up in a table (`LlamaModel._rope_rows`): every row is
    what computing it in the step gives, for any batch of positions, after the table grew too."""
    _, model = _make(tmp_path_factory, name)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.arange(n) for n in (1, 7, 64)] + [torch.randint(0, 512, (n,), generator=gen) for n in (1, 3, 16, 64, 300)]
    batches += [torch.tensor([5000, 2, 4097]), torch.randint(0, 9000, (50,), generator=gen)]  # past the first table: it grows
    for positions in batches:
        cos, sin = model._rope(positions, torch.float32)
        want_cos, want_sin = model._rope_computed(positions, torch.float32)
        assert cos.shape == want_cos.shape == (len(positions), 1, model.config.head_dim)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        assert cos.is_contiguous() and sin.is_contiguous()  # (what the fused rotary pass takes)
    assert model._rope_table[0].shape[0] == 16384  # doubled to cover 8999, no further
    cos, _ = model._rope(torch.tensor([3, 1]), torch.float64)  # another dtype: a table of its own
    assert cos.dtype == torch.float64 and torch.equal(cos, model._rope_computed(torch.tensor([3, 1]), torch.float64)[0])
