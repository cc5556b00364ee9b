"""An independent attack on the fused CPU passes (fused_ops / layer_ops.c), the paged decode kernel's
work items and the ThreadGovernor, by a reviewer who did not write them: what held up, kept as
regression tests (edge values, odd shapes, aliasing, writes past buffers, thread and batch
independence, fallbacks, exceptions inside a governed step)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from inflight.model import cpu_attention, fused_ops

needs_c = pytest.mark.skipif(fused_ops.load() is None, reason=f"no C compiler: {fused_ops.build_error()}")
needs_attn = pytest.mark.skipif(cpu_attention.load() is None, reason="no C attention kernel")


def _ulps(a, b):
    ai, bi = a.contiguous().view(torch.int32).long(), b.contiguous().view(torch.int32).long()
    return int((ai - bi).abs().max()) if a.numel() else 0


def _rope(T, D, gen, shape3=True):
    pos = torch.randint(0, 4000, (T,), generator=gen).float()
    freqs = pos[:, None] / (10000 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat((freqs, freqs), dim=-1)
    if shape3:
        emb = emb[:, None, :]
    return emb.cos(), emb.sin()


def _run_py(code: str, timeout=120):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=os.getcwd())


# --- rotary_and_cache ----------------------------------------------------------------------------

@needs_c
@pytest.mark.parametrize("T", [0, 1, 2])
def test_rotary_and_cache_tiny_and_empty_batches(T):
    gen = torch.Generator().manual_seed(T)
    H, KV, D = 3, 1, 10
    cos, sin = _rope(T, D, gen)
    qkv = torch.randn(T, (H + 2 * KV) * D, generator=gen)
    slots = torch.randperm(16, generator=gen)[:T]
    k1, v1, k2, v2 = (torch.zeros(4, 4, KV, D) for _ in range(4))
    want = fused_ops.rotary_and_cache_reference(qkv.clone(), cos, sin, k1, v1, slots, H, KV)
    got = fused_ops.rotary_and_cache(qkv.clone(), cos, sin, k2, v2, slots, H, KV)
    assert got.shape == want.shape == (T, H, D)
    assert torch.equal(got, want) and torch.equal(k1, k2) and torch.equal(v1, v2)


@needs_c
def test_rotary_and_cache_nonfinite_values_match_the_reference():
    gen = torch.Generator().manual_seed(5)
    T, H, KV, D = 6, 4, 2, 16
    cos, sin = _rope(T, D, gen)
    qkv = torch.randn(T, (H + 2 * KV) * D, generator=gen) * 1e38
    qkv[0, 3], qkv[1, 70], qkv[2, 5], qkv[3, 100] = float("nan"), float("inf"), -float("inf"), float("nan")
    slots = torch.tensor([3, 0, 7, 1, 2, 5])
    k1, v1, k2, v2 = (torch.zeros(2, 4, KV, D) for _ in range(4))
    want = fused_ops.rotary_and_cache_reference(qkv.clone(), cos, sin, k1, v1, slots, H, KV)
    got = fused_ops.rotary_and_cache(qkv.clone(), cos, sin, k2, v2, slots, H, KV)
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(k2, k1, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v2, v1, rtol=0, atol=0, equal_nan=True)


@needs_c
def test_rotary_and_cache_strided_qkv_and_bf16_cache_and_grad_take_the_reference():
    gen = torch.Generator().manual_seed(6)
    T, H, KV, D = 5, 4, 2, 8
    cos, sin = _rope(T, D, gen)
    slots = torch.tensor([9, 1, 4, 0, 12])
    wide = torch.randn(T, (H + 2 * KV) * D + 3, generator=gen)
    qkv = wide[:, :(H + 2 * KV) * D]  # non-contiguous view
    before = wide.clone()
    k1, v1, k2, v2 = (torch.zeros(4, 4, KV, D) for _ in range(4))
    want = fused_ops.rotary_and_cache_reference(qkv, cos, sin, k1, v1, slots, H, KV)
    got = fused_ops.rotary_and_cache(qkv, cos, sin, k2, v2, slots, H, KV)
    assert torch.equal(got, want) and torch.equal(k1, k2) and torch.equal(wide, before)
    # bf16 caches with an fp32 model
    kb1, vb1, kb2, vb2 = (torch.zeros(4, 4, KV, D, dtype=torch.bfloat16) for _ in range(4))
    q = qkv.contiguous()
    want = fused_ops.rotary_and_cache_reference(q.clone(), cos, sin, kb1, vb1, slots, H, KV)
    got = fused_ops.rotary_and_cache(q.clone(), cos, sin, kb2, vb2, slots, H, KV)
    assert torch.equal(got, want) and torch.equal(kb1, kb2) and torch.equal(vb1, vb2)
    # requires_grad with grad on: reference (keeps the graph); under no_grad / inference_mode: the C pass
    qg = q.clone().requires_grad_()
    out = fused_ops.rotary_and_cache(qg, cos, sin, torch.zeros(4, 4, KV, D), torch.zeros(4, 4, KV, D), slots, H, KV)
    out.sum().backward()
    assert qg.grad is not None
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            k3, v3 = torch.zeros(4, 4, KV, D), torch.zeros(4, 4, KV, D)
            got = fused_ops.rotary_and_cache(qg.detach().clone(), cos, sin, k3, v3, slots, H, KV)
            k4, v4 = torch.zeros(4, 4, KV, D), torch.zeros(4, 4, KV, D)
            want = fused_ops.rotary_and_cache_reference(qg.detach().clone(), cos, sin, k4, v4, slots, H, KV)
        assert torch.equal(got, want) and torch.equal(k3, k4)


@needs_c
def test_rotary_and_cache_int32_slot_mapping_behaves_as_the_reference():
    gen = torch.Generator().manual_seed(8)
    T, H, KV, D = 4, 2, 1, 8
    cos, sin = _rope(T, D, gen)
    qkv = torch.randn(T, (H + 2 * KV) * D, generator=gen)
    slots = torch.tensor([3, 0, 7, 1], dtype=torch.int32)
    res = []
    for fn in (fused_ops.rotary_and_cache_reference, fused_ops.rotary_and_cache):
        k, v = torch.zeros(2, 4, KV, D), torch.zeros(2, 4, KV, D)
        try:
            res.append(("ok", fn(qkv.clone(), cos, sin, k, v, slots, H, KV), k, v))
        except Exception as e:  # noqa: BLE001
            res.append(("err", type(e)))
    assert res[0][0] == res[1][0]
    if res[0][0] == "ok":
        assert all(torch.equal(a, b) for a, b in zip(res[0][1:], res[1][1:]))


@needs_c
@pytest.mark.parametrize("bad", [-1, 32, 2**40])
def test_rotary_and_cache_bad_slot_raises_in_a_subprocess_without_crashing(bad):
    r = _run_py(f"""
        import torch, inflight
        from inflight.model import fused_ops
        T, H, KV, D = 300, 8, 4, 64   # big enough for the OpenMP branch
        qkv = torch.randn(T, (H + 2 * KV) * D)
        cos = torch.ones(T, 1, D); sin = torch.zeros(T, 1, D)
        kc, vc = torch.zeros(4, 8, KV, D), torch.zeros(4, 8, KV, D)
        slots = torch.arange(T) % 32
        slots[T - 1] = {bad}
        try:
            fused_ops.rotary_and_cache(qkv, cos, sin, kc, vc, slots, H, KV)
        except IndexError as e:
            assert not kc.any() and not vc.any()
            print("IndexError", e)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "IndexError" in r.stdout


@needs_c
def test_rotary_and_cache_big_batch_is_bitwise_independent_of_threads_and_batch():
    gen = torch.Generator().manual_seed(9)
    T, H, KV, D = 200, 8, 2, 64  # T * width >= 65536: the OpenMP branch
    cos, sin = _rope(T, D, gen)
    qkv = torch.randn(T, (H + 2 * KV) * D, generator=gen)
    slots = torch.randperm(64 * 4, generator=gen)[:T]
    outs = []
    old = torch.get_num_threads()
    try:
        for th in (1, 2, 3):
            torch.set_num_threads(th)
            k, v = torch.zeros(64, 4, KV, D), torch.zeros(64, 4, KV, D)
            outs.append((fused_ops.rotary_and_cache(qkv.clone(), cos, sin, k, v, slots, H, KV), k, v))
    finally:
        torch.set_num_threads(old)
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(o, outs[0]))
    k, v = torch.zeros(64, 4, KV, D), torch.zeros(64, 4, KV, D)
    alone = fused_ops.rotary_and_cache(qkv[17:18].clone(), cos[17:18], sin[17:18], k, v, slots[17:18], H, KV)
    assert torch.equal(alone[0], outs[0][0][17])


# --- rms_norm ---------------------------------------------------------------------------------------

@needs_c
def test_rms_norm_residual_aliasing_x_matches_the_reference():
    gen = torch.Generator().manual_seed(10)
    x, w = torch.randn(7, 24, generator=gen), torch.randn(24, generator=gen)
    want_out, want_res = fused_ops.rms_norm_reference(x.clone(), w, 1e-6, x.clone())
    buf = x.clone()
    got_out, got_res = fused_ops.rms_norm(buf, w, 1e-6, buf)  # residual is x
    assert torch.equal(got_res, want_res)  # 2x exactly
    assert _ulps(got_out, want_out) <= 4


@needs_c
@pytest.mark.parametrize("shape", [(0, 16), (5, 0), (16,), (2, 3, 17), (1, 1)])
def test_rms_norm_odd_shapes(shape):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(*shape, generator=gen)
    r = torch.randn(*shape, generator=gen)
    w = torch.randn(shape[-1], generator=gen)
    got = fused_ops.rms_norm(x, w, 1e-5)
    want = fused_ops.rms_norm_reference(x, w, 1e-5)
    assert got.shape == want.shape and _ulps(got, want) <= 4
    got_o, got_r = fused_ops.rms_norm(x, w, 1e-5, r.clone())
    want_o, want_r = fused_ops.rms_norm_reference(x, w, 1e-5, r.clone())
    assert torch.equal(got_r, want_r) and _ulps(got_o, want_o) <= 4


@needs_c
def test_rms_norm_huge_and_nonfinite_rows():
    x = torch.tensor([[3e38, 3e38, 1.0, 2.0],     # sum of squares overflows
                      [float("inf"), 1.0, 1.0, 1.0],
                      [float("nan"), 1.0, 1.0, 1.0],
                      [0.0, 0.0, 0.0, 0.0],
                      [1e-30, -1e-30, 1e-30, 0.0]])
    w = torch.tensor([1.0, -2.0, 0.5, 3.0])
    got, want = fused_ops.rms_norm(x, w, 1e-6), fused_ops.rms_norm_reference(x, w, 1e-6)
    torch.testing.assert_close(got, want, rtol=5e-7, atol=0, equal_nan=True)


@needs_c
@pytest.mark.parametrize("dim", [8192, 65536])
def test_rms_norm_stays_within_a_few_ulp_of_the_reference_at_any_row_length(dim):
    """The sum of squares is added in double, so the error doesn't grow with the row (an earlier float
    sum drifted to 7-8 ulp at 8192 and 57 at 65536 for near-constant rows)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(dim, generator=gen)
    for x in (torch.randn(8, dim, generator=gen) * 5, 3.0 + torch.randn(4, dim, generator=gen) * 1e-3):
        assert _ulps(fused_ops.rms_norm(x, w, 1e-5), fused_ops.rms_norm_reference(x, w, 1e-5)) <= 4


# --- silu_and_mul -------------------------------------------------------------------------------------

@needs_c
@pytest.mark.parametrize("shape", [(0, 8), (8,), (3, 2, 10), (1, 2)])
def test_silu_and_mul_odd_shapes(shape):
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(*shape, generator=gen) * 10
    got, want = fused_ops.silu_and_mul(x), fused_ops.silu_and_mul_reference(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=5e-7, atol=1e-37)


@needs_c
def test_silu_and_mul_odd_last_dim_is_the_reference_error():
    x = torch.randn(3, 7)
    with pytest.raises(RuntimeError):
        fused_ops.silu_and_mul_reference(x)
    with pytest.raises(RuntimeError):
        fused_ops.silu_and_mul(x)


@needs_c
def test_fused_ops_do_not_write_past_their_outputs():
    """Outputs carved from a bigger buffer (via out-of-band C calls) keep the guard bytes."""
    lib = fused_ops.load()
    for rows, dim in [(3, 1), (5, 7), (4, 9), (2, 17)]:
        x = torch.randn(rows, dim)
        w = torch.randn(dim)
        buf = torch.full((rows * dim + 64,), 12345.0)
        lib.inflight_rms_norm_f32(x.data_ptr(), None, w.data_ptr(), rows, dim, 1e-5, buf.data_ptr(), 2)
        assert torch.all(buf[rows * dim:] == 12345.0)
        g = torch.randn(rows, 2 * dim)
        buf = torch.full((rows * dim + 64,), 12345.0)
        lib.inflight_silu_and_mul_f32(g.data_ptr(), rows, dim, buf.data_ptr(), 2)
        assert torch.all(buf[rows * dim:] == 12345.0)
        res, out = torch.full((rows * dim + 64,), 1.0), torch.empty(rows * dim)
        lib.inflight_rms_norm_f32(x.data_ptr(), res.data_ptr(), w.data_ptr(), rows, dim, 1e-5, out.data_ptr(), 2)
        assert torch.all(res[rows * dim:] == 1.0)


# --- paged decode kernel --------------------------------------------------------------------------

def _naive_decode(q, kc, vc, tables, lens, scale):
    n, H, D = q.shape
    bs, KV = kc.shape[1], kc.shape[2]
    out = torch.empty(n, H, D, dtype=torch.float64)
    for i in range(n):
        L = int(lens[i])
        slots = torch.tensor([int(tables[i, j // bs]) * bs + j % bs for j in range(L)])
        k = kc.view(-1, KV, D)[slots].double()
        v = vc.view(-1, KV, D)[slots].double()
        for h in range(H):
            g = h // (H // KV)
            p = torch.softmax((k[:, g] @ q[i, h].double()) * scale, 0)
            out[i, h] = p @ v[:, g]
    return out.float()


def _decode_case(n, H, KV, D, bs, seed, max_len=40):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len, (n,), generator=gen, dtype=torch.int32)
    max_blocks = (max_len + bs - 1) // bs
    nb = n * max_blocks + 3
    tables = torch.randperm(nb, generator=gen)[: n * max_blocks].view(n, max_blocks).to(torch.int32)
    kc, vc = torch.randn(nb, bs, KV, D, generator=gen), torch.randn(nb, bs, KV, D, generator=gen)
    q = torch.randn(n, H, D, generator=gen)
    return q, kc, vc, tables, lens


@needs_attn
@pytest.mark.parametrize("H, KV, D, bs", [(8, 2, 13, 3), (6, 3, 64, 16), (4, 4, 5, 1), (64, 1, 9, 7)])
def test_paged_decode_bits_independent_of_thread_count_and_batch(H, KV, D, bs):
    q, kc, vc, tables, lens = _decode_case(13, H, KV, D, bs, seed=H + D)
    scale = D ** -0.5
    old = torch.get_num_threads()
    outs = []
    try:
        for th in (1, 2, 3, 4, 7):  # 13 >= 4 * th for th <= 3: whole sequences; else per kv head
            torch.set_num_threads(th)
            outs.append(cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, scale))
            # each sequence alone (per kv head items), and in a 4*th-sized batch
            alone = [cpu_attention.paged_decode_attention_cpu(q[i:i + 1], kc, vc, tables[i:i + 1], lens[i:i + 1], scale)
                     for i in (0, 6, 12)]
            for i, a in zip((0, 6, 12), alone):
                assert torch.equal(a[0], outs[0][i]), (th, i)
    finally:
        torch.set_num_threads(old)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    torch.testing.assert_close(outs[0], _naive_decode(q, kc, vc, tables, lens, scale), rtol=2e-5, atol=2e-5)


@needs_attn
def test_paged_decode_extreme_scores_and_noncontiguous_q():
    q, kc, vc, tables, lens = _decode_case(9, 4, 2, 16, 4, seed=3)
    q = (q * 1e3).transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous [n, H, D]
    assert not q.is_contiguous()
    got = cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, 0.25)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _naive_decode(q, kc, vc, tables, lens, 0.25), rtol=1e-4, atol=1e-4)


@needs_attn
def test_paged_decode_workspace_never_overruns_in_a_subprocess():
    """Long contexts, many heads, threads > n and n >= 4 * threads, under a subprocess (a heap overrun
    would abort it): results must equal a run sequence by sequence."""
    r = _run_py("""
        import torch, inflight
        from inflight.model import cpu_attention
        gen = torch.Generator().manual_seed(0)
        for th, n in ((1, 4), (2, 8), (2, 3), (3, 12), (4, 1)):
            torch.set_num_threads(th)
            H, KV, D, bs = 16, 2, 24, 5
            lens = torch.randint(1, 300, (n,), generator=gen, dtype=torch.int32); lens[0] = 300
            mb = 60
            tables = torch.randint(0, 80, (n, mb), generator=gen, dtype=torch.int32)
            kc, vc = torch.randn(80, bs, KV, D, generator=gen), torch.randn(80, bs, KV, D, generator=gen)
            q = torch.randn(n, H, D, generator=gen)
            out = cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, 0.2)
            for i in range(n):
                one = cpu_attention.paged_decode_attention_cpu(q[i:i+1], kc, vc, tables[i:i+1], lens[i:i+1], 0.2)
                assert torch.equal(one[0], out[i]), (th, n, i)
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


# --- the model: engine tokens, serving forward vs the pre-change model, training ----------------------

def _odd_configs():
    from inflight.model.llama import LlamaConfig
    return [LlamaConfig(vocab_size=97, hidden_size=36, intermediate_size=22, num_hidden_layers=2, num_attention_heads=3,
                        num_key_value_heads=1, head_dim=10, max_position_embeddings=256, tie_word_embeddings=False),
            LlamaConfig(vocab_size=61, hidden_size=24, intermediate_size=26, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=6, max_position_embeddings=256, tie_word_embeddings=True)]


def _random_model(cfg, seed=0):
    from inflight.model.llama import LlamaModel
    torch.manual_seed(seed)
    m = LlamaModel(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m


@needs_c
@pytest.mark.parametrize("ci", [0, 1])
def test_engine_tokens_fused_vs_reference_on_odd_gqa_shapes(ci, monkeypatch):
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams
    cfg = _odd_configs()[ci]
    m = _random_model(cfg, ci)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in (3, 17, 1, 40, 9, 2)]

    def run():
        e = LLMEngine(m, block_size=4, num_blocks=128, max_batch_size=3, max_batched_tokens=16)
        return [o.token_ids for o in e.generate(prompts, SamplingParams(max_tokens=30, ignore_eos=True), use_tqdm=False)]

    fused = run()
    monkeypatch.setattr(fused_ops, "_fusable", lambda *t: False)
    assert run() == fused


# --- the ThreadGovernor ----------------------------------------------------------------------------

def _tiny_engine():
    from inflight.engine.llm_engine import LLMEngine
    return LLMEngine(_random_model(_odd_configs()[1], 5), block_size=4, num_blocks=64, max_batch_size=2,
                     max_batched_tokens=16)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_a_step_that_raises_leaves_torchs_thread_count_as_it_was(exc, monkeypatch):
    from inflight.engine.sampling import SamplingParams
    from inflight.engine.thread_governor import ThreadGovernor
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = _tiny_engine()
        gov = ThreadGovernor(read_others=lambda: 1, torch_spins=False)  # a neighbour on one of two cores: narrow to one thread
        gov.cores, gov.others = 2, 1.0  # (its average already caught up)
        engine.runner.threads = gov
        seen = []

        def boom(*a, **k):
            seen.append(torch.get_num_threads())
            raise exc("boom")

        monkeypatch.setattr(engine.runner, "_run", boom)
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=3))
        with pytest.raises(exc):
            engine.step()
        assert seen and seen[0] == 1  # it did narrow the step
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_governed_engine_tokens_equal_ungoverned_and_count_restored():
    from inflight.engine.sampling import SamplingParams
    from inflight.engine.thread_governor import ThreadGovernor
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    prompts = [[1, 2, 3, 4, 5], list(range(30)), [7]]
    try:
        outs = []
        for reader in (None, iter([0, 1, 0, 1, 1, 1, 0] * 100).__next__):
            engine = _tiny_engine()
            if reader is None:
                engine.runner.threads = None
            else:
                engine.runner.threads = ThreadGovernor(read_others=reader)
                engine.runner.threads.cores = 2
            outs.append([o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True),
                                                              use_tqdm=False)])
            assert torch.get_num_threads() == 2
        assert outs[0] == outs[1]
    finally:
        torch.set_num_threads(before)


@needs_c
def test_serving_forward_with_grad_enabled_and_trainable_weights_falls_back_and_matches_no_grad():
    """Nobody wrapped the call in no_grad: every pass must take the reference (weights want a
    gradient), and the logits must equal those of the inference-mode call to float rounding."""
    from inflight.model.attention_metadata import AttentionMetadata
    from inflight.model.kv_cache import KVCache
    cfg = _odd_configs()[1]
    m = _random_model(cfg, 9)
    ids = torch.tensor([5, 9, 1, 7, 3])
    meta = AttentionMetadata.build([5], [5], [[2, 0]], 4, "cpu")
    outs = []
    for ctx in (torch.enable_grad, torch.inference_mode):
        kv = KVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4, 4, torch.float32, "cpu")
        with ctx():
            outs.append(m(ids, meta.positions, meta, kv))
    assert outs[0].requires_grad
    outs[0].sum().backward()
    assert m.layers[0].mlp.gate_up_proj.weight.grad is not None
    torch.testing.assert_close(outs[0].detach(), outs[1], rtol=1e-5, atol=1e-5)


