"""The fused C passes between the matrix multiplies against their torch references (inflight.model.fused_ops)."""
import pytest
import torch

from inflight.model import fused_ops, skinny_gemm

needs_c = pytest.mark.skipif(fused_ops.load() is None, reason=f"no C compiler here: {fused_ops.build_error()}")


def _rope(T, D, gen):
    pos = torch.randint(0, 4000, (T,), generator=gen).float()
    freqs = pos[:, None] / (10000 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos(), emb.sin()


def _projections(T, H, KV, D, gen):
    return torch.randn(T, (H + 2 * KV) * D, generator=gen) * 3


@needs_c
@pytest.mark.parametrize("H, KV, D", [(4, 4, 64), (8, 2, 6), (3, 1, 2), (2, 2, 100)])
@pytest.mark.parametrize("T", [1, 5, 130])
def test_rotary_and_cache_agrees_with_the_reference_to_the_bit(H, KV, D, T):
    gen = torch.Generator().manual_seed(H * 1000 + D + T)
    cos, sin = _rope(T, D, gen)
    qkv = _projections(T, H, KV, D, gen)
    slots = torch.randperm(4 * 8, generator=gen)[:T] if T <= 32 else torch.randperm(40 * 8, generator=gen)[:T]
    num_blocks = 4 if T <= 32 else 40
    caches = [(torch.zeros(num_blocks, 8, KV, D), torch.zeros(num_blocks, 8, KV, D)) for _ in range(2)]
    (kc1, vc1), (kc2, vc2) = caches
    want = fused_ops.rotary_and_cache_reference(qkv.clone(), cos, sin, kc1, vc1, slots, H, KV)
    got = fused_ops.rotary_and_cache(qkv.clone(), cos, sin, kc2, vc2, slots, H, KV)
    assert torch.equal(got, want)
    assert torch.equal(kc2, kc1) and torch.equal(vc2, vc1)


@needs_c
def test_a_slot_outside_the_cache_is_an_error_and_nothing_is_written():
    gen = torch.Generator().manual_seed(0)
    cos, sin = _rope(3, 8, gen)
    qkv = _projections(3, 2, 1, 8, gen)
    kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    with pytest.raises(IndexError, match="token 2: slot 8 is outside the cache"):
        fused_ops.rotary_and_cache(qkv, cos, sin, kc, vc, torch.tensor([0, 7, 8]), 2, 1)
    assert not kc.any() and not vc.any()


@needs_c
@pytest.mark.parametrize("dim", [1, 7, 9, 256, 1000])
def test_rms_norm_is_within_a_unit_or_two_in_the_last_place_and_adds_the_residual_exactly(dim):
    gen = torch.Generator().manual_seed(dim)
    x, res, w = torch.randn(37, dim, generator=gen) * 5, torch.randn(37, dim, generator=gen), torch.randn(dim, generator=gen)
    want_out, want_res = fused_ops.rms_norm_reference(x, w, 1e-5, res.clone())
    got_res = res.clone()
    got_out, same = fused_ops.rms_norm(x, w, 1e-5, got_res)
    assert same is got_res  # updated in place: the residual stream's running sum
    assert torch.equal(got_res, want_res)
    torch.testing.assert_close(got_out, want_out, rtol=5e-7, atol=1e-6)
    torch.testing.assert_close(fused_ops.rms_norm(x, w, 1e-5), fused_ops.rms_norm_reference(x, w, 1e-5),
                               rtol=5e-7, atol=1e-6)


@needs_c
@pytest.mark.parametrize("inter", [1, 5, 8, 13, 688])
def test_silu_and_mul_matches_the_reference_over_the_whole_float_range(inter):
    gen = torch.Generator().manual_seed(inter)
    gate = torch.cat([torch.linspace(-120, 120, 4001), torch.randn(2000, generator=gen) * 4,
                      torch.tensor([0.0, -0.0, 1e-30, -1e-30, 87.0, -87.5, 89.0, -89.0])])
    gate = gate[: gate.numel() // inter * inter].reshape(-1, inter)
    x = torch.cat([gate, torch.randn(gate.shape, generator=gen)], dim=-1)
    got, want = fused_ops.silu_and_mul(x), fused_ops.silu_and_mul_reference(x)
    torch.testing.assert_close(got, want, rtol=5e-7, atol=1e-37)


@needs_c
@pytest.mark.skipif(skinny_gemm.lanes() != 16,
                    reason="no AVX-512 here: the passes are built 8 wide only")
def test_the_avx512_build_gives_the_bits_of_the_8_wide_one(monkeypatch):
    """Built for AVX-512, SwiGLU takes sixteen lanes at a time (exp16: exp8's operations in the same
    order, lane for lane); the file built with -mno-avx512f -- what a CPU without AVX-512 runs --
    gives the same bits for all three passes, over the whole float range and at widths off 16."""
    from inflight.model import c_build

    gen = torch.Generator().manual_seed(11)
    gate = torch.cat([torch.linspace(-120, 120, 4001), torch.randn(4000, generator=gen) * 4,
                      torch.tensor([0.0, -0.0, 1e-30, -1e-30, 87.0, -87.5, 89.0, -89.0])])
    cases = []
    for inter in (688, 24, 13):
        g = gate[: gate.numel() // inter * inter].reshape(-1, inter)
        cases.append(torch.cat([g, torch.randn(g.shape, generator=gen)], dim=-1))
    x, res, w = torch.randn(70, 256, generator=gen), torch.randn(70, 256, generator=gen), torch.randn(256, generator=gen)

    def run():
        return [fused_ops.silu_and_mul(c) for c in cases] + list(fused_ops.rms_norm(x, w, 1e-5, res.clone()))

    wide = run()
    narrow = c_build.LazyLibrary(fused_ops.SOURCE, fused_ops.FLAGS + ["-mno-avx512f"], fused_ops.SYMBOLS,
                                 fused_ops._declare)
    assert narrow.load() is not None
    monkeypatch.setattr(fused_ops, "_library", narrow)
    for got, want in zip(run(), wide):
        assert torch.equal(got, want)


@needs_c
def test_a_row_gets_the_same_bits_alone_or_in_a_batch():
    gen = torch.Generator().manual_seed(3)
    x, res, w = torch.randn(300, 256, generator=gen), torch.randn(300, 256, generator=gen), torch.randn(256, generator=gen)
    gu = torch.randn(300, 2 * 688, generator=gen)
    batch_norm, _ = fused_ops.rms_norm(x, w, 1e-5, res.clone())  # 300 x 256: shared out over threads
    batch_silu = fused_ops.silu_and_mul(gu)
    for i in (0, 77, 299):
        alone, _ = fused_ops.rms_norm(x[i:i + 1].clone(), w, 1e-5, res[i:i + 1].clone())
        assert torch.equal(alone, batch_norm[i:i + 1])
        assert torch.equal(fused_ops.silu_and_mul(gu[i:i + 1].clone()), batch_silu[i:i + 1])


@pytest.mark.parametrize("case", ["bfloat16", "grad", "strided"])
def test_what_the_c_pass_cannot_take_runs_the_reference(case):
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(6, 16, generator=gen), torch.randn(16, generator=gen)
    gu = torch.randn(6, 32, generator=gen)
    if case == "bfloat16":
        x, w, gu = x.bfloat16(), w.bfloat16(), gu.bfloat16()
    elif case == "grad":
        x.requires_grad_(), gu.requires_grad_()
    else:
        x, gu = torch.randn(16, 6, generator=gen).t(), torch.randn(32, 6, generator=gen).t()
    norm = fused_ops.rms_norm(x, w, 1e-5)
    assert torch.equal(norm, fused_ops.rms_norm_reference(x, w, 1e-5))
    assert torch.equal(fused_ops.silu_and_mul(gu), fused_ops.silu_and_mul_reference(gu))
    if case == "grad":
        norm.sum().backward()  # the reference keeps the graph: training still works
        assert x.grad is not None


def test_turned_off_everything_runs_the_reference(monkeypatch):
    monkeypatch.setenv("INFLIGHT_CPU_KERNEL", "0")
    monkeypatch.setattr(fused_ops, "_library", fused_ops._library.fresh())
    assert fused_ops.load() is None and "INFLIGHT_CPU_KERNEL=0" in fused_ops.build_error()
    x = torch.randn(4, 8)
    assert torch.equal(fused_ops.silu_and_mul(x), fused_ops.silu_and_mul_reference(x))


@needs_c
def test_the_profiler_names_each_fused_pass():
    x, w, gu = torch.randn(4, 8), torch.randn(8), torch.randn(4, 16)
    with torch.profiler.profile() as prof:
        fused_ops.rms_norm(x, w, 1e-5)
        fused_ops.silu_and_mul(gu)
    names = {e.key for e in prof.key_averages()}
    assert {"inflight::rms_norm_c", "inflight::silu_and_mul_c"} <= names


@needs_c
def test_the_engine_gives_the_same_tokens_with_and_without_the_fused_passes(monkeypatch):
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams
    from inflight.model.loading import load_tiny

    model = load_tiny()[0].eval()
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (3, 17, 1, 40, 9)]

    def run():
        # block_size 4 and a small batch: decodes, prefill chunks and mixed steps
        engine = LLMEngine(model, block_size=4, num_blocks=64, max_batch_size=3, max_batched_tokens=16)
        outs = engine.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True), use_tqdm=False)
        return [o.token_ids for o in outs]

    fused = run()
    monkeypatch.setattr(fused_ops, "_fusable", lambda *tensors: False)
    assert run() == fused
