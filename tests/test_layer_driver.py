"""Every decoder layer of a step in one C call (inflight.model.layer_driver) against the op-by-op
layers it replaces: the same logits and the same cache, to the bit, and the op-by-op path wherever
the driver must not take a step."""
import warnings
from collections import defaultdict

import pytest
import torch

from inflight.model import cpu_attention, fused_ops, layer_driver, skinny_gemm
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache
from inflight.model.llama import LlamaConfig, LlamaModel

needs_c = pytest.mark.skipif(layer_driver.load() is None or fused_ops.load() is None or skinny_gemm.load() is None
                             or cpu_attention.load() is None, reason="no C compiler here")

CONFIGS = {
    "gqa": LlamaConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "biases": LlamaConfig(num_attention_heads=6, num_key_value_heads=2, hidden_size=192, head_dim=32, qkv_bias=True,
                          attention_bias=True, mlp_bias=True),
    "mha, odd widths": LlamaConfig(num_attention_heads=3, num_key_value_heads=3, hidden_size=96, head_dim=30,
                                   intermediate_size=101, num_hidden_layers=3),
}


def _step(cfg, query_lens, context_lens, seed, block_size=16):
    """Metadata over shuffled blocks, and two identical caches with random contents (earlier tokens)."""
    gen = torch.Generator().manual_seed(seed)
    per = [(c + block_size - 1) // block_size for c in context_lens]
    num_blocks = sum(per) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in per:
        tables.append(order[at:at + n])
        at += n
    kv = [KVCache.for_model(cfg, num_blocks=num_blocks, block_size=block_size, dtype=torch.float32, device="cpu")
          for _ in range(2)]
    for a, b in zip(kv[0].k_cache + kv[0].v_cache, kv[1].k_cache + kv[1].v_cache):
        a.copy_(torch.randn(a.shape, generator=gen))
        b.copy_(a)
    metas = [AttentionMetadata.build(query_lens, context_lens, tables, block_size) for _ in range(2)]
    ids = torch.randint(0, cfg.vocab_size, (sum(query_lens),), generator=gen)
    return ids, metas, kv


def _both(model, ids, metas, kv, logits_indices=None):
    """(driven, op by op): logits and caches, and how many steps the driver clocked."""
    seconds, calls = defaultdict(float), defaultdict(int)
    undo = layer_driver.clock_into(seconds, calls)
    try:
        with torch.inference_mode():
            driven = model(ids, metas[0].positions, metas[0], kv[0], logits_indices)
            steps = calls["attention, decode-only steps"] + calls["attention, steps with prompt tokens"]
            with layer_driver.op_by_op():
                ops = model(ids, metas[1].positions, metas[1], kv[1], logits_indices)
    finally:
        undo()
    return driven, ops, steps // len(model.layers)


def _same_cache(kv):
    return all(torch.equal(a, b) for a, b in zip(kv[0].k_cache + kv[0].v_cache, kv[1].k_cache + kv[1].v_cache))


@needs_c
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("query_lens, context_lens", [
    ([1] * 57, [60 + i for i in range(57)]),      # a decode step
    ([1], [1]),                                   # one token, the first of its sequence
    ([1, 1, 9], [40, 7, 9]),                       # decodes beside a whole prompt
    ([5, 1, 30], [25, 300, 30]),                   # a prompt's chunk after earlier chunks, a long decode
    ([200], [250]),                                # one long chunk (200 rows)
])
def test_the_driven_layers_are_the_op_by_op_layers_to_the_bit(name, query_lens, context_lens):
    cfg = CONFIGS[name]
    torch.manual_seed(len(query_lens))
    model = LlamaModel(cfg).eval()
    ids, metas, kv = _step(cfg, query_lens, context_lens, seed=sum(context_lens))
    last = torch.tensor([sum(query_lens[:i + 1]) - 1 for i in range(len(query_lens))])
    driven, ops, steps = _both(model, ids, metas, kv, last)
    assert steps == 1  # the driver took the step
    assert torch.equal(driven, ops)
    assert _same_cache(kv)
    assert model.attention_backend.last_used == "c"


@needs_c
def test_a_prompt_gets_the_same_bits_alone_and_in_a_prefill_step_of_hundreds_of_rows():
    """The driver and its GEMM take every step up to `skinny_gemm.max_rows()` rows at either vector
    width, so a prompt's logits don't depend on how many tokens its step carried. (Built 8 wide, steps
    past 256 rows used to go op by op to torch's BLAS, whose blocking gave other bits.)"""
    cfg = CONFIGS["gqa"]
    torch.manual_seed(5)
    model = LlamaModel(cfg).eval()
    lens = [300, 40, 250]  # three fresh prompts in one step: 590 rows
    ids = torch.randint(0, cfg.vocab_size, (sum(lens),))
    kv = KVCache.for_model(cfg, num_blocks=64, block_size=16, dtype=torch.float32, device="cpu")
    tables = [list(range(0, 19)), list(range(19, 22)), list(range(22, 38))]
    meta = AttentionMetadata.build(lens, lens, tables, 16)
    seconds, calls = defaultdict(float), defaultdict(int)
    undo = layer_driver.clock_into(seconds, calls)
    try:
        with torch.inference_mode():
            together = model(ids, meta.positions, meta, kv)
            mine = slice(300, 340)
            meta_alone = AttentionMetadata.build([40], [40], [tables[1]], 16)
            alone = model(ids[mine], meta_alone.positions, meta_alone, kv)
    finally:
        undo()
    assert calls["attention, steps with prompt tokens"] == 2 * len(model.layers)  # both steps were driven
    assert torch.equal(together[mine], alone)


@needs_c
def test_every_row_of_logits_too_and_again_after_a_weight_changes_in_place():
    cfg = CONFIGS["gqa"]
    model = LlamaModel(cfg).eval()
    ids, metas, kv = _step(cfg, [1, 4], [12, 4], seed=1)
    driven, ops, steps = _both(model, ids, metas, kv)
    assert steps == 1 and torch.equal(driven, ops) and driven.shape == (5, cfg.vocab_size)
    with torch.no_grad():  # the driver's table points at packed weights: they must follow the change
        model.layers[1].mlp.down_proj.weight.mul_(-2)
        model.layers[0].input_layernorm.weight.add_(0.5)
    ids, metas, kv = _step(cfg, [1, 4], [12, 4], seed=1)
    driven2, ops2, steps = _both(model, ids, metas, kv)
    assert steps == 1 and torch.equal(driven2, ops2) and not torch.equal(driven2, driven)


@needs_c
def test_the_engine_gives_the_same_tokens_driven_and_op_by_op():
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams
    from inflight.model.loading import load_tiny

    model = load_tiny()[0].eval()
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (3, 17, 1, 40, 9)]
    params = [SamplingParams(max_tokens=20, ignore_eos=True), SamplingParams(max_tokens=24, temperature=0.8, seed=3),
              SamplingParams(max_tokens=16, ignore_eos=True), SamplingParams(max_tokens=30, temperature=1.0, seed=5),
              SamplingParams(max_tokens=12, top_p=0.9, temperature=0.7, seed=1)]

    def run():
        # block_size 4 and a small batch: decodes, prefill chunks and mixed steps
        engine = LLMEngine(model, block_size=4, num_blocks=64, max_batch_size=3, max_batched_tokens=16)
        return [o.token_ids for o in engine.generate(prompts, params, use_tqdm=False)]

    seconds, calls = defaultdict(float), defaultdict(int)
    undo = layer_driver.clock_into(seconds, calls)
    try:
        driven = run()
    finally:
        undo()
    with layer_driver.op_by_op():
        ops = run()
    assert driven == ops
    assert calls["linear layers"] > 0  # the engine's steps were driven


@needs_c
@pytest.mark.parametrize("case", ["op_by_op", "env", "reference_only", "grad", "profiler", "backend torch",
                                  "too many rows", "long prompt", "half precision"])
def test_where_the_driver_must_not_take_the_step_the_layers_run_op_by_op(case, monkeypatch):
    cfg = CONFIGS["gqa"]
    model = LlamaModel(cfg).eval()
    query_lens, context_lens = ([3, 1], [3, 20])
    if case == "too many rows":  # (a 2049-token step would be past the prompt context first: a smaller bound)
        monkeypatch.setattr(skinny_gemm, "max_rows", lambda: sum(query_lens) - 1)
    if case == "long prompt":  # past the context the C kernel takes prompts for: the reference's SDPA
        query_lens, context_lens = [8, 1], [600, 30]
    ids, metas, kv = _step(cfg, query_lens, context_lens, seed=2)
    if case == "half precision":
        model = model.to(torch.bfloat16)
        kv = [KVCache.for_model(cfg, num_blocks=kv[0].k_cache[0].shape[0], block_size=16, dtype=torch.bfloat16,
                                device="cpu") for _ in range(2)]
    if case == "backend torch":
        model.attention_backend = type(model.attention_backend)("torch")
    if case == "env":
        monkeypatch.setenv(layer_driver.OFF_VAR, "0")
    seconds, calls = defaultdict(float), defaultdict(int)
    undo = layer_driver.clock_into(seconds, calls)
    try:
        with torch.inference_mode(case != "grad"), torch.set_grad_enabled(case == "grad"):
            if case == "op_by_op":
                with layer_driver.op_by_op():
                    out = model(ids, metas[0].positions, metas[0], kv[0])
            elif case == "reference_only":
                with fused_ops.reference_only():
                    out = model(ids, metas[0].positions, metas[0], kv[0])
            elif case == "profiler":
                with torch.profiler.profile() as prof:
                    out = model(ids, metas[0].positions, metas[0], kv[0])
                names = {e.key for e in prof.key_averages()}
                assert {"inflight::skinny_gemm_c", "inflight::paged_attention_c"} <= names  # each kernel by name
                assert layer_driver.PROFILER_NAME not in names
            else:
                out = model(ids, metas[0].positions, metas[0], kv[0])
    finally:
        undo()
    assert not calls, f"the driver took a step it must leave alone ({case})"
    assert torch.isfinite(out.float()).all()


@needs_c
def test_a_slot_outside_the_cache_is_the_op_by_op_error():
    cfg = CONFIGS["gqa"]
    model = LlamaModel(cfg).eval()
    ids, metas, kv = _step(cfg, [1, 1], [10, 20], seed=3)
    num_slots = kv[0].k_cache[0].shape[0] * 16
    for m in metas:
        m.slot_mapping[1] = num_slots + 5
    errors = []
    for i, ctx in enumerate([layer_driver.op_by_op(), torch.no_grad()]):
        with pytest.raises(IndexError) as err, ctx, torch.inference_mode():
            model(ids, metas[i].positions, metas[i], kv[i])
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "outside the cache" in errors[0]
    assert _same_cache(kv)  # nothing written by either


@needs_c
def test_a_block_table_outside_the_cache_goes_the_way_it_goes_op_by_op():
    """The C kernel refuses it before reading; the backend warns, stops using the kernel and asks the
    reference, which raises on the index: the same warning, state and error either way."""
    cfg = CONFIGS["gqa"]
    seen = []
    for driven in (True, False):
        torch.manual_seed(0)
        model = LlamaModel(cfg).eval()
        ids, metas, kv = _step(cfg, [1, 1], [10, 20], seed=4)
        metas[0].block_tables[0, 0] = kv[0].k_cache[0].shape[0] + 7
        with warnings.catch_warnings(record=True) as caught, torch.inference_mode(), \
                pytest.raises(RuntimeError) as err:
            warnings.simplefilter("always")
            if driven:
                model(ids, metas[0].positions, metas[0], kv[0])
            else:
                with layer_driver.op_by_op():
                    model(ids, metas[0].positions, metas[0], kv[0])
        seen.append((str(err.value), model.attention_backend.kernel_error,
                     [str(w.message) for w in caught if "decode kernel failed" in str(w.message)]))
    assert seen[0] == seen[1] and seen[0][1] is not None and seen[0][2]


@needs_c
def test_the_time_split_sees_the_driven_kernels():
    from inflight.bench.offline.time_split import TimeSplit

    cfg = CONFIGS["gqa"]
    model = LlamaModel(cfg).eval()
    ids, metas, kv = _step(cfg, [1] * 8, [30] * 8, seed=5)
    with TimeSplit(model) as ts, torch.inference_mode():
        model(ids, metas[0].positions, metas[0], kv[0])
    n = cfg.num_hidden_layers
    assert ts.calls["attention, decode-only steps"] == n
    assert ts.calls["norms, rotary + KV write, SwiGLU"] == 4 * n + 1  # and the final norm, in Python
    assert ts.calls["linear layers"] == 4 * n + 1  # and the LM head, through llama._linear
    parts = sum(ts.seconds[k] for k in ("linear layers", "attention, decode-only steps",
                                        "norms, rotary + KV write, SwiGLU"))
    assert 0 < parts <= ts.seconds["forward pass"]


@needs_c
@pytest.mark.parametrize("rows", ["repeated", "none", "outside"])
def test_the_logits_rows_asked_for_are_those_op_by_op_gives(rows):
    cfg = CONFIGS["biases"]
    model = LlamaModel(cfg).eval()
    ids, metas, kv = _step(cfg, [1, 6, 1], [9, 6, 30], seed=6)
    idx = {"repeated": torch.tensor([7, 0, 6, 6, 1]), "none": torch.tensor([], dtype=torch.long),
           "outside": torch.tensor([0, 8])}[rows]
    if rows == "outside":  # the same IndexError, from either path
        errors = []
        for i, ctx in enumerate([torch.no_grad(), layer_driver.op_by_op()]):
            with pytest.raises(IndexError) as err, ctx, torch.inference_mode():
                model(ids, metas[i].positions, metas[i], kv[i], idx)
            errors.append(str(err.value))
        assert errors[0] == errors[1]
        return
    driven, ops, steps = _both(model, ids, metas, kv, idx)
    assert steps == 1 and torch.equal(driven, ops) and driven.shape == (len(idx), cfg.vocab_size)
    assert _same_cache(kv)


@needs_c
def test_a_token_id_outside_the_vocabulary_is_the_op_by_op_error():
    cfg = CONFIGS["gqa"]
    model = LlamaModel(cfg).eval()
    ids, metas, kv = _step(cfg, [1, 3], [10, 3], seed=7)
    ids[2] = cfg.vocab_size + 3
    errors = []
    for i, ctx in enumerate([torch.no_grad(), layer_driver.op_by_op()]):
        with pytest.raises(IndexError) as err, ctx, torch.inference_mode():
            model(ids, metas[i].positions, metas[i], kv[i])
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert _same_cache(kv)


@needs_c
def test_positions_past_the_rotary_table_are_left_to_the_op_by_op_path():
    """Positions given apart from the metadata (here past every context) are checked in C against
    the rotary table; beyond it the step is refused before anything is written and runs op by op."""
    cfg = CONFIGS["gqa"]
    model = LlamaModel(cfg).eval()
    ids, metas, kv = _step(cfg, [1, 1], [10, 20], seed=8)
    far = metas[0].positions + 5000
    with torch.inference_mode():
        driven = model(ids, far, metas[0], kv[0])
        with layer_driver.op_by_op():
            ops = model(ids, far.clone(), metas[1], kv[1])
    assert torch.equal(driven, ops) and _same_cache(kv)
