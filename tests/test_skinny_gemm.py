"""The skinny-GEMM kernel (inflight.model.skinny_gemm): a linear layer for a decode step's few rows."""
import pytest
import torch
import torch.nn.functional as F

from inflight.model import fused_ops, skinny_gemm

needs_c = pytest.mark.skipif(skinny_gemm.load() is None, reason=f"no C compiler here: {skinny_gemm.build_error()}")


def _close(got, want, k):
    # float32 sums of k products in another order: a few units in the last place of the largest term
    return torch.allclose(got, want, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_c
@pytest.mark.parametrize("M", [1, 2, 3, 7, 16, 64])
@pytest.mark.parametrize("K, N", [(256, 512), (688, 256), (10, 3), (257, 67), (8, 4), (1, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_it_computes_the_linear_layer(M, K, N, bias):
    gen = torch.Generator().manual_seed(M * 7 + K + N)
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen)
    b = torch.randn(N, generator=gen) if bias else None
    with torch.profiler.profile() as prof:
        got = skinny_gemm.linear(x, w, b)
    assert "inflight::skinny_gemm_c" in {e.key for e in prof.key_averages()}  # the kernel ran
    assert got.shape == (M, N) and _close(got, F.linear(x, w, b), K)


@needs_c
def test_a_row_gets_the_same_bits_in_any_batch_and_on_any_number_of_threads():
    """Every output is one fixed sum: which rows come with it, where it sits in its block of four
    columns, and which thread computes it change nothing."""
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(64, 250, generator=gen), torch.randn(1030, 250, generator=gen), torch.randn(1030, generator=gen)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [skinny_gemm.linear(x[i:i + 1], w, b)[0] for i in range(64)]
        torch.set_num_threads(2)
        for M in (2, 5, 17, 64):
            batch = skinny_gemm.linear(x[:M], w, b)
            for i in range(M):
                assert torch.equal(batch[i], alone[i])
        # the column a weight row lands in within its block of four doesn't matter either
        shifted = skinny_gemm.linear(x[:4], w[1:], b[1:])
        assert torch.equal(shifted[:, :1024], skinny_gemm.linear(x[:4], w, b)[:, 1:1025])
    finally:
        torch.set_num_threads(before)


def _built_so_gives_the_same_bits(flags):
    """The kernel built with `flags` instead of its own against the kernel as built here, on tiles of
    every shape and tails: equal to the bit."""
    from inflight.model import c_build, thread_pool

    other = c_build.LazyLibrary(skinny_gemm.SOURCE, flags, skinny_gemm.SYMBOLS, skinny_gemm._declare).load()
    assert other is not None
    gen = torch.Generator().manual_seed(3)
    for M, K, N, bias in [(1, 256, 512, False), (7, 688, 256, True), (9, 256, 1376, False), (37, 250, 1029, True),
                          (64, 256, 257, False), (300, 64, 48, True), (5, 3, 17, False)]:
        x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen)
        b = torch.randn(N, generator=gen) if bias else None
        out = torch.empty(M, N)
        other.inflight_packed_gemm_f32(x.data_ptr(), M, K, skinny_gemm.panels(w).data_ptr(), N,
                                       None if b is None else b.data_ptr(), out.data_ptr(), thread_pool.threads())
        assert torch.equal(skinny_gemm.kernel_linear(x, w, b), out), (M, K, N, bias)
    return other


@needs_c
@pytest.mark.skipif(skinny_gemm.lanes() != 16, reason="the kernel is built 8 wide here (no AVX-512)")
def test_the_16_wide_tile_gives_the_bits_of_the_8_wide_one():
    """Built for AVX-512 the kernel takes two panels and eight rows a tile, 16 lanes a register; built
    without it (-mno-avx512f: what a CPU without AVX-512 runs), six rows and 8 lanes. Each output is
    the same chain of multiply-adds either way, so the two agree to the bit: a reader's CPU changes
    the speed, never the tokens."""
    narrow = _built_so_gives_the_same_bits(skinny_gemm.FLAGS + ["-mno-avx512f"])
    assert narrow.inflight_gemm_lanes() == 8


@needs_c
def test_every_multiply_add_is_written_out_so_the_compilers_fusing_changes_no_bit():
    """Each output's chain of multiply-adds is written out (fma8 / fma16) and the kernel is built with
    -ffp-contract=off, so no compiler is left to fuse a product into a sum in one tile and not another:
    built with GCC's default (-ffp-contract=fast) it gives the same bits, every tile shape and tail."""
    assert "-ffp-contract=off" in skinny_gemm.FLAGS
    _built_so_gives_the_same_bits([f for f in skinny_gemm.FLAGS if f != "-ffp-contract=off"] + ["-ffp-contract=fast"])


@pytest.mark.parametrize("case", ["no_rows", "many_rows", "float64", "grad", "not_contiguous", "three_d", "reference_only"])
def test_what_the_kernel_does_not_take_goes_to_torch(case):
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 16, generator=gen), torch.randn(8, 16, generator=gen)
    if case == "no_rows":
        x = x[:0]
    elif case == "many_rows":
        x = torch.randn(skinny_gemm.max_rows() + 1, 16, generator=gen)
    elif case == "float64":
        x, w = x.double(), w.double()
    elif case == "grad":
        w.requires_grad_(True)
    elif case == "not_contiguous":
        x = torch.randn(16, 4, generator=gen).t()
    elif case == "three_d":
        x = x[None]
    with torch.profiler.profile() as prof:
        if case == "reference_only":
            with fused_ops.reference_only():
                got = skinny_gemm.linear(x, w)
        else:
            got = skinny_gemm.linear(x, w)
    assert "inflight::skinny_gemm_c" not in {e.key for e in prof.key_averages()}
    assert torch.equal(got, F.linear(x, w))
    if case == "grad":
        got.sum().backward()  # torch keeps the graph: training still works
        assert w.grad is not None


def test_shapes_that_do_not_fit_are_torchs_error_not_a_crash():
    with pytest.raises(RuntimeError):
        skinny_gemm.linear(torch.randn(4, 16), torch.randn(8, 15))
    with pytest.raises(RuntimeError):
        skinny_gemm.linear(torch.randn(4, 16), torch.randn(8, 16), torch.randn(7))


def test_turned_off_it_runs_torch(monkeypatch):
    monkeypatch.setenv("INFLIGHT_CPU_KERNEL", "0")
    monkeypatch.setattr(skinny_gemm, "_library", skinny_gemm._library.fresh())
    assert skinny_gemm.load() is None and "INFLIGHT_CPU_KERNEL=0" in skinny_gemm.build_error()
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    assert torch.equal(skinny_gemm.linear(x, w), F.linear(x, w))


@needs_c
def test_the_engine_gives_the_same_tokens_with_and_without_the_kernel():
    from inflight.engine.llm_engine import LLMEngine
    from inflight.engine.sampling import SamplingParams
    from inflight.model.loading import load_tiny

    model = load_tiny()[0].eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (3, 17, 1, 40, 9, 2)]

    def run():
        engine = LLMEngine(model, block_size=4, num_blocks=64, max_batch_size=4, max_batched_tokens=16)
        outs = engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), use_tqdm=False)
        return [o.token_ids for o in outs]

    with torch.profiler.profile() as prof:
        with_kernel = run()
    assert "inflight::skinny_gemm_c" in {e.key for e in prof.key_averages()}
    with fused_ops.reference_only():
        assert run() == with_kernel


@needs_c
def test_the_kernel_called_directly_refuses_what_it_cannot_take():
    with pytest.raises(ValueError, match="contiguous float32"):
        skinny_gemm.kernel_linear(torch.randn(4, 16).double(), torch.randn(8, 16).double())
    with pytest.raises(ValueError, match="contiguous float32"):
        skinny_gemm.kernel_linear(torch.randn(16, 4).t(), torch.randn(8, 16))
    x, w = torch.randn(100, 16), torch.randn(8, 16)  # more rows than the engine gives it: still right
    assert _close(skinny_gemm.kernel_linear(x, w), F.linear(x, w), 16)
