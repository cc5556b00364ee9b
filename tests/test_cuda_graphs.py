"""The CUDA-graph decode path (`inflight.engine.cuda_graphs`), checked on a CPU: the same static
buffers, padded buckets and scratch block run eagerly here, and must give exactly the tokens of the
unpadded path. The capture itself is checked on a GPU by `.ci/gpu` (test at the end: CUDA only)."""
import random

import pytest
import torch

import inflight.engine.llm_engine as llm_engine
from inflight.engine.cuda_graphs import MAX_CAPTURE_SIZE, DecodeGraphRunner, batch_buckets, wants_cuda_graphs
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams
from inflight.engine.sequence import Sequence
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache
from inflight.model.llama import LlamaConfig, LlamaModel

torch.set_num_threads(1)

CONFIGS = {
    "gqa": dict(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128),
    "mha-tied": dict(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=3,
                     num_key_value_heads=3, max_position_embeddings=128, tie_word_embeddings=True),
    "gqa3": dict(vocab_size=50, hidden_size=36, intermediate_size=40, num_hidden_layers=2, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=12, max_position_embeddings=128),
}


def _model(name, seed=0):
    torch.manual_seed(seed)
    return LlamaModel(LlamaConfig(**CONFIGS[name])).eval()


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(8) == [1, 2, 4, 8]
    assert batch_buckets(12) == [1, 2, 4, 8, 12]
    assert batch_buckets(10_000)[-1] == MAX_CAPTURE_SIZE
    with pytest.raises(ValueError, match="max_batch_size"):
        batch_buckets(0)


def test_only_cuda_and_not_eager():
    assert wants_cuda_graphs(torch.device("cuda"), enforce_eager=False)
    assert not wants_cuda_graphs(torch.device("cuda"), enforce_eager=True)
    assert not wants_cuda_graphs(torch.device("cpu"), enforce_eager=False)
    engine = LLMEngine(_model("gqa"), num_blocks=8, max_batch_size=4)
    assert engine.runner.graphs is None and engine.kv_cache.num_blocks == 8  # never on a CPU


def test_scratch_block_must_be_in_the_cache():
    model = _model("gqa")
    kv = KVCache.for_model(model.config, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="scratch_block"):
        DecodeGraphRunner(model, kv, max_batch_size=4, max_model_len=32, scratch_block=4, capture=False)


def _decode_seq(rng, vocab, free_blocks, block_size, context):
    """A request whose first `context - 1` tokens are in the cache and whose last one is to be decoded."""
    s = Sequence(f"r{context}-{len(free_blocks)}", [rng.randrange(vocab) for _ in range(context)],
                 SamplingParams(max_tokens=1), 0.0)
    s.block_table = [free_blocks.pop() for _ in range(-(-context // block_size))]
    s.num_computed_tokens, s.num_scheduled_tokens = context - 1, 1
    return s


def _fill_cache(model, kv, seqs):
    """Write every sequence's earlier tokens' K/V into its blocks (one eager prefill each)."""
    for s in seqs:
        n = s.num_computed_tokens
        if n == 0:
            continue
        meta = AttentionMetadata.build([n], [n], [s.block_table], kv.block_size)
        model(torch.tensor(s.token_ids[:n]), meta.positions, meta, kv)


def _unpadded_logits(model, kv, seqs):
    meta = AttentionMetadata.build([1] * len(seqs), [s.num_tokens for s in seqs], [s.block_table for s in seqs],
                                   kv.block_size)
    ids = torch.tensor([s.token_ids[-1] for s in seqs])
    return model(ids, meta.positions, meta, kv)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("n", [1, 3, 5, 8])
@torch.inference_mode()
def test_padded_bucket_gives_the_unpadded_tokens(name, n):
    """Mixed context lengths, block tables scattered over the pool: the padded bucket's first n
    rows give the unpadded batch's logits (to rounding) and exactly its greedy tokens."""
    model, rng = _model(name), random.Random(n)
    block_size, num_blocks = 4, 64
    kv = KVCache.for_model(model.config, num_blocks=num_blocks + 1, block_size=block_size)
    free = list(range(num_blocks))
    rng.shuffle(free)
    seqs = [_decode_seq(rng, model.config.vocab_size, free, block_size, rng.randint(1, 30)) for _ in range(n)]
    _fill_cache(model, kv, seqs)
    runner = DecodeGraphRunner(model, kv, max_batch_size=8, max_model_len=64, scratch_block=num_blocks, capture=False)
    assert runner.can_run(seqs)
    bucket, longest = runner.prepare(seqs)
    assert bucket == runner.bucket(n) and bucket >= n
    padded = runner.forward(n, bucket, longest).clone()
    want = _unpadded_logits(model, kv, seqs)  # rewrites the same K/V into the same slots
    torch.testing.assert_close(padded, want, rtol=1e-5, atol=1e-5)
    assert padded.argmax(-1).tolist() == want.argmax(-1).tolist()


def _generate(engine, prompts, max_tokens):
    ids = [engine.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True)) for p, m in zip(prompts, max_tokens)]
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, list(o.token_ids)) for o in engine.step() if o.finished)
    return [done[i] for i in ids]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_engine_on_the_padded_path_matches_eager(name, monkeypatch):
    """The whole engine with the graph path switched on (eagerly, on a CPU): requests of mixed
    lengths arrive, grow new blocks between steps, finish, get preempted under a small pool; every
    token equals the eager engine's."""
    rng = random.Random(7)
    model = _model(name)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(rng.randint(1, 20))] for _ in range(11)]
    lengths = [rng.randint(1, 24) for _ in prompts]
    kwargs = dict(block_size=4, num_blocks=40, max_batch_size=6, debug=True)
    want = _generate(LLMEngine(model, **kwargs), prompts, lengths)
    monkeypatch.setattr(llm_engine, "wants_cuda_graphs", lambda device, enforce_eager: not enforce_eager)
    engine = LLMEngine(model, **kwargs)
    assert engine.runner.graphs is not None and not engine.runner.graphs.graphs  # padded path, no capture on CPU
    assert engine.kv_cache.num_blocks == 41 and engine.num_blocks == 40  # the scratch block is nobody's
    steps = []
    orig = engine.runner.graphs.forward
    engine.runner.graphs.forward = lambda n, b, c: steps.append((n, b)) or orig(n, b, c)
    assert _generate(engine, prompts, lengths) == want
    assert any(n < b for n, b in steps) and len({b for _, b in steps}) > 1  # padded steps, several buckets
    assert LLMEngine(model, enforce_eager=True, **kwargs).runner.graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_captured_graphs_match_eager_on_cuda():
    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(**CONFIGS["gqa"])).eval().to("cuda")
    rng = random.Random(1)
    prompts = [[rng.randrange(61) for _ in range(rng.randint(1, 20))] for _ in range(9)]
    lengths = [rng.randint(1, 30) for _ in prompts]
    want = _generate(LLMEngine(model, block_size=16, num_blocks=64, max_batch_size=8, enforce_eager=True), prompts,
                     lengths)
    engine = LLMEngine(model, block_size=16, num_blocks=64, max_batch_size=8)
    assert sorted(engine.runner.graphs.graphs) == [1, 2, 4, 8], engine.runner.graphs.capture_error
    assert _generate(engine, prompts, lengths) == want
