"""The C decode kernel (`inflight.model.cpu_attention`): same answers as the reference on ragged,
paged, grouped-query batches; the dispatcher's use of it; and what happens where it can't be built."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.model import attention as attn, fused_ops
from inflight.model import cpu_attention, skinny_gemm
from inflight.model.attention_metadata import AttentionMetadata
from test_kv_cache_attention import _naive, _random_batch

needs_kernel = pytest.mark.skipif(cpu_attention.load() is None, reason=f"no C kernel here: {cpu_attention.build_error()}")


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 12), block_size=st.sampled_from([1, 3, 16]), kvh=st.sampled_from([1, 2]),
       g=st.sampled_from([1, 3, 4]), D=st.sampled_from([4, 12, 64]), seed=st.integers(0, 2**16), data=st.data())
def test_c_kernel_matches_naive_on_random_decode_batches(n, block_size, kvh, g, D, seed, data):
    # head sizes that are not multiples of 8 and contexts that are not multiples of 4 take the tails
    ctx = data.draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(seed), [1] * n, ctx, block_size, kvh, g, D)
    out = cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3)
    torch.testing.assert_close(out, _naive(q, kc, vc, meta, 0.3), atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("kvh, g", [(1, 1), (4, 1), (2, 3)])
def test_a_sequence_gets_the_same_bits_alone_or_in_a_large_batch(kvh, g):
    """A large batch gives each thread whole sequences (contiguous reads), a small one single kv heads;
    each head's arithmetic is the same either way, so batch composition can't change a bit."""
    ctx = [1, 7, 16, 17, 40, 3, 64, 33, 9, 12, 28, 50]
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(kvh * 10 + g), [1] * len(ctx), ctx, 16, kvh, g, 24)
    batched = cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3)
    for i in range(len(ctx)):
        alone = cpu_attention.paged_decode_attention_cpu(q[i:i + 1], kc, vc, meta.block_tables[i:i + 1],
                                                         meta.context_lens[i:i + 1], 0.3)
        assert torch.equal(alone, batched[i:i + 1]), f"sequence {i}"


def _each_query_alone_gets_the_bits_of_the_call(q, kc, vc, meta):
    """One call over all of `q`'s queries against each query in a call of its own: equal to the bit (and
    all of them close to the definition)."""
    together = cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3)
    for i in range(q.shape[0]):
        alone = cpu_attention.paged_decode_attention_cpu(q[i:i + 1], kc, vc, meta.block_tables[i:i + 1],
                                                         meta.context_lens[i:i + 1], 0.3)
        # the bit patterns, not the values: -0.0 and +0.0 are equal values
        assert torch.equal(alone.view(torch.int32), together[i:i + 1].view(torch.int32)), \
            f"query {i} (context {int(meta.context_lens[i])})"
    torch.testing.assert_close(together, _naive(q, kc, vc, meta, 0.3), atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("kvh, g, block_size, D", [(1, 1, 16, 64), (2, 2, 16, 64), (2, 3, 5, 24), (1, 4, 1, 12)])
def test_a_prompts_tokens_in_one_call_get_the_bits_of_one_at_a_time(kvh, g, block_size, D):
    """A prompt chunk's tokens come to the kernel as consecutive queries over one block table (a
    thread may take several in a row, their blocks already in cache); each token's arithmetic is its
    own, so the call's other queries change no bit -- with decodes around them, tokens whose block
    tables part, and a sibling on the same blocks whose length doesn't follow. (Such runs are attended
    a tile at a time, `attend_tile`: this test holds the tiles to the bit where the tables part, the
    run cut there, as it held commit 4c6ccf5's.)"""
    gen = torch.Generator().manual_seed(kvh * 100 + g * 10 + block_size)
    prompt = list(range(30, 30 + 45))  # 45 tokens of one prompt at positions 30..74
    ctx = [50, 3] + prompt + [74, 12]  # then a sibling at the prompt's last length on its blocks (n > 1)
    q, kc, vc, meta = _random_batch(gen, [1] * len(ctx), ctx, block_size, kvh, g, D)
    first, last = 2, 2 + len(prompt) - 1
    rows = meta.block_tables.tolist()
    shared = rows[last][:-(-ctx[last] // block_size)]  # the prompt's table: its last token's blocks
    parted = [shared[1], shared[0]] + shared[2:]  # ... and, from token 30 on, two blocks swapped
    tables = [r[:-(-c // block_size)] for r, c in zip(rows, ctx)]
    for i in range(first, last + 2):
        tables[i] = (shared if i < first + 30 else parted)[:-(-ctx[i] // block_size)]
    meta = AttentionMetadata.build([1] * len(ctx), ctx, tables, block_size)
    _each_query_alone_gets_the_bits_of_the_call(q, kc, vc, meta)


def _built_so_gives_the_same_bits(monkeypatch, flags, q, kc, vc, meta):
    """The kernel as built here against the same file built with `flags` instead: equal to the bit."""
    from inflight.model import c_build

    here = cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3)
    other = c_build.LazyLibrary(cpu_attention.SOURCE, flags, cpu_attention.SYMBOLS, cpu_attention._declare)
    assert other.load() is not None, other.build_error()
    monkeypatch.setattr(cpu_attention, "_library", other)
    there = cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3)
    assert torch.equal(there.view(torch.int32), here.view(torch.int32))


def _built_8_wide_gives_the_same_bits(monkeypatch, q, kc, vc, meta):
    """The kernel as built here (AVX-512) against the same file built with -mno-avx512f (what a CPU
    without AVX-512 runs): equal to the bit."""
    _built_so_gives_the_same_bits(monkeypatch, cpu_attention.FLAGS + ["-mno-avx512f"], q, kc, vc, meta)


@needs_kernel
@pytest.mark.skipif(skinny_gemm.lanes() != 16,
                    reason="no AVX-512 here: the kernel is built 8 wide only")
@pytest.mark.parametrize("kvh, g, block_size, D", [(2, 2, 16, 64), (1, 3, 16, 64), (2, 1, 5, 24), (1, 4, 16, 8),
                                                   (2, 2, 8, 128)])
def test_the_avx512_build_gives_the_bits_of_the_8_wide_one(monkeypatch, kvh, g, block_size, D):
    """Built for AVX-512 the kernel scores eight keys at a time, two in each 16-float register, and
    sums values 16 lanes wide; each score and each output is the same chain of operations as the
    8-wide build's (-mno-avx512f: what a CPU without AVX-512 runs), so the two agree to the bit --
    decodes and a prompt's tokens alike, odd group sizes and contexts off the tile too. (Head sizes
    that are multiples of 8, as every model the book serves has: a head size off the width ends in
    scalar tails whose code the compiler picks per CPU, and at D = 12 the two builds differ in the
    last bits -- the kernel before the 16-wide tile did too.)"""
    gen = torch.Generator().manual_seed(kvh * 100 + g * 10 + D)
    ctx = [1, 7, 8, 9, 16, 17, 40, 63, 64, 65, 100] + list(range(20, 60))
    q, kc, vc, meta = _random_batch(gen, [1] * len(ctx), ctx, block_size, kvh, g, D)
    _built_8_wide_gives_the_same_bits(monkeypatch, q, kc, vc, meta)


def _prompt_runs(gen, prompts, decodes, block_size, kvh, g, D):
    """Prefill chunks as the engine lays them out -- each prompt's tokens consecutive queries over its
    own block table, positions start..end -- with decodes (other sequences) between them."""
    spans = [(0, p) for p in prompts if isinstance(p, int)] + [p for p in prompts if not isinstance(p, int)]
    need = [-(-end // block_size) for _, end in spans] + [-(-c // block_size) for c in decodes]
    perm = torch.randperm(sum(need) + 2, generator=gen).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at:at + n])
        at += n
    ctx, rows = [], []
    for k, c in enumerate(decodes[:1]):  # a decode before the first prompt
        ctx.append(c), rows.append(tables[len(spans) + k])
    for (start, end), table in zip(spans, tables):
        for L in range(start + 1, end + 1):
            ctx.append(L), rows.append(table[:-(-L // block_size)])
    for k, c in enumerate(decodes[1:], 1):
        ctx.append(c), rows.append(tables[len(spans) + k])
    meta = AttentionMetadata.build([1] * len(ctx), ctx, rows, block_size)
    n_blocks = len(perm)
    k_cache = torch.randn(n_blocks, block_size, kvh, D, generator=gen)
    v_cache = torch.randn(n_blocks, block_size, kvh, D, generator=gen)
    return torch.randn(len(ctx), kvh * g, D, generator=gen), k_cache, v_cache, meta


#: (kv heads, group size, block size, head size): one kv head and sixteen tokens a tile, two kv heads of
#: two (the random models'), a group of three (five tokens, fifteen lanes), head sizes that end in a
#: vector-at-a-time remainder (16, 48), a long head (128), blocks of 5 and 1, a group too wide to tile
PROMPT_SHAPES = [(1, 1, 16, 64), (2, 2, 16, 64), (1, 3, 16, 64), (2, 2, 5, 48), (1, 2, 1, 16), (2, 1, 16, 128),
                 (1, 16, 16, 64)]


@needs_kernel
@pytest.mark.parametrize("kvh, g, block_size, D", PROMPT_SHAPES)
def test_a_prompts_tokens_attended_as_tiles_get_the_bits_of_one_at_a_time(kvh, g, block_size, D):
    """A prefill chunk's consecutive tokens are attended as tiles, their queries along the vector lanes
    (the scores a matrix product, every score's summation order still dot's); each token's output must be
    the bits it gets alone, which is the decode path. Prompts of every length around a tile's width,
    a chunk that starts mid-prompt (its earlier tokens cached), decodes around them."""
    gen = torch.Generator().manual_seed(kvh * 1000 + g * 100 + block_size + D)
    prompts = [1, 2, 7, 16, 17, 33, (40, 75), 130]
    q, kc, vc, meta = _prompt_runs(gen, prompts, [9, 50, 3], block_size, kvh, g, D)
    _each_query_alone_gets_the_bits_of_the_call(q, kc, vc, meta)


@needs_kernel
@pytest.mark.skipif(skinny_gemm.lanes() != 16,
                    reason="no AVX-512 here: the kernel is built 8 wide only")
@pytest.mark.parametrize("kvh, g, block_size, D", PROMPT_SHAPES)
def test_prompt_tiles_of_16_and_of_8_lanes_give_the_same_bits(monkeypatch, kvh, g, block_size, D):
    """Built 8 wide a tile holds eight queries, built for AVX-512 sixteen: different tiles, different
    lanes, the same chain of operations for every score and output."""
    gen = torch.Generator().manual_seed(kvh * 1000 + g * 100 + block_size + D + 1)
    q, kc, vc, meta = _prompt_runs(gen, [3, 8, 16, 31, (20, 64), 100], [12, 70], block_size, kvh, g, D)
    _built_8_wide_gives_the_same_bits(monkeypatch, q, kc, vc, meta)


@needs_kernel
@pytest.mark.parametrize("kvh, g, block_size, D", [(1, 1, 16, 64), (2, 2, 16, 64), (2, 3, 5, 24), (1, 4, 1, 12)])
def test_every_multiply_add_is_written_out_so_the_compilers_fusing_changes_no_bit(monkeypatch, kvh, g, block_size, D):
    """"The same chain of operations on every path" holds only if the compiler does not fuse a product
    and a sum in one copy of a loop and not in another (GCC's default, -ffp-contract=fast, does that:
    regrouping the tile's value lanes once left three of eight tokens of a tile a unit in the last
    place off their decode). So every multiply-add is written out (vec8.h's fma8) and the kernel is
    built with -ffp-contract=off; built with GCC's default instead, nothing is left for it to fuse, and
    the two builds agree to the bit -- prompts as tiles, lone tokens and decodes."""
    gen = torch.Generator().manual_seed(kvh * 1000 + g * 100 + block_size + D)
    q, kc, vc, meta = _prompt_runs(gen, [1, 7, 17, 33, (40, 75)], [9, 50, 3], block_size, kvh, g, D)
    assert "-ffp-contract=off" in cpu_attention.FLAGS
    fast = [f for f in cpu_attention.FLAGS if f != "-ffp-contract=off"] + ["-ffp-contract=fast"]
    _built_so_gives_the_same_bits(monkeypatch, fast, q, kc, vc, meta)


@needs_kernel
@pytest.mark.parametrize("kvh, g, block_size, D", [(1, 1, 16, 64), (2, 2, 16, 64), (2, 3, 5, 24)])
def test_the_form_gcc_11_builds_gives_the_same_bits(monkeypatch, kvh, g, block_size, D):
    """GCC 11 (Ubuntu 22.04's: Colab's) has no __builtin_shufflevector; vec8.h / vec16.h pick lanes with
    __builtin_shuffle there, and with copies where a pick changes the width. Built in that form by the
    compiler here (-DINFLIGHT_NO_SHUFFLEVECTOR), at this CPU's width, the kernel gives the same bits:
    decodes (the lanes' sums), a prompt's tiles, and on an AVX-512 CPU its 16-wide scores."""
    gen = torch.Generator().manual_seed(kvh * 1000 + g * 100 + block_size + D + 1)
    q, kc, vc, meta = _prompt_runs(gen, [1, 7, 17, 33, (40, 75)], [9, 50, 3, 64, 65, 100], block_size, kvh, g, D)
    _built_so_gives_the_same_bits(monkeypatch, cpu_attention.FLAGS + ["-DINFLIGHT_NO_SHUFFLEVECTOR"], q, kc, vc, meta)


@needs_kernel
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_tiles_shorter_queries_never_touch_the_keys_past_their_own_length(bad):
    """A tile reads keys up to its longest query's length; the shorter ones give those keys no weight,
    and must not multiply them either (0 x inf is NaN). With a non-finite key and value at the longest
    query's last position, and two sequences that share their first blocks but part at the last, every
    other query keeps its own finite answer, bit for bit."""
    gen = torch.Generator().manual_seed(11)
    kc, vc = torch.randn(4, 16, 1, 64, generator=gen), torch.randn(4, 16, 1, 64, generator=gen)
    q = torch.randn(6, 2, 64, generator=gen)
    lens = torch.tensor([5, 6, 7, 8, 32, 33], dtype=torch.int32)
    # a prompt's four tokens on block 0; two sequences on blocks 1, 2 that part at their third block
    tables = torch.tensor([[0, 0, 0]] * 4 + [[1, 2, 0], [1, 2, 3]], dtype=torch.int32)
    kc[0, 7], vc[0, 7] = bad, bad  # position 7 of block 0: only the fourth query's
    kc[3, 0], vc[3, 0] = bad, bad  # position 32, in block 3: only the sixth query's
    together = cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, 0.3)
    for i in (0, 1, 2, 4):
        alone = cpu_attention.paged_decode_attention_cpu(q[i:i + 1], kc, vc, tables[i:i + 1], lens[i:i + 1], 0.3)
        assert alone.isfinite().all()
        assert torch.equal(alone.view(torch.int32), together[i:i + 1].view(torch.int32)), f"query {i}"


@needs_kernel
def test_a_tile_keeps_a_negative_zero():
    """A query whose output is -0.0 alone is -0.0 in a tile too: the longer queries' keys add nothing to
    its chain (not even +0)."""
    D = 16
    q, kc, vc = torch.zeros(2, 1, D), torch.zeros(1, 16, 1, D), torch.zeros(1, 16, 1, D)
    q[:, 0, 0] = 1
    kc[0, 1, 0, 0], vc[0, 1, 0, :], vc[0, 2, 0, :] = -1000.0, -1e-40, 1.0
    tables, lens = torch.zeros(2, 1, dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32)
    alone = cpu_attention.paged_decode_attention_cpu(q[:1], kc, vc, tables[:1], lens[:1], 1.0)
    together = cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, 1.0)
    assert torch.signbit(alone[0, 0, 0])
    assert torch.equal(alone.view(torch.int32), together[:1].view(torch.int32))


@needs_kernel
def test_a_workspace_too_small_for_a_tile_takes_the_tokens_one_at_a_time(monkeypatch):
    """The tile's scratch (queries transposed, scores, sums) is larger than a lone query's; handed only a
    lone query's, the kernel attends the tokens one by one -- the same bits, no error."""
    gen = torch.Generator().manual_seed(3)
    q, kc, vc, meta = _prompt_runs(gen, [60], [5], 16, 2, 2, 64)
    tiled = cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3)
    monkeypatch.setattr(cpu_attention, "workspace_per_thread", lambda H, D, longest, span: H * (min(longest, span) + 1))
    assert torch.equal(cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3),
                       tiled)


@needs_kernel
def test_c_kernel_gives_the_same_bits_whatever_the_block_layout():
    """Each sequence is summed in position order, so where its blocks live changes nothing (chapter 5's check)."""
    gen = torch.Generator().manual_seed(5)
    ctx = [37, 5, 64]
    q = torch.randn(3, 4, 16, generator=gen)
    keys = [torch.randn(c, 2, 16, generator=gen) for c in ctx]
    vals = [torch.randn(c, 2, 16, generator=gen) for c in ctx]

    def run(block_size, tables, num_blocks):
        kc = torch.zeros(num_blocks, block_size, 2, 16)
        vc = torch.zeros_like(kc)
        for i, c in enumerate(ctx):
            for p in range(c):
                kc[tables[i][p // block_size], p % block_size] = keys[i][p]
                vc[tables[i][p // block_size], p % block_size] = vals[i][p]
        t = torch.tensor([row + [0] * (max(map(len, tables)) - len(row)) for row in tables], dtype=torch.int32)
        return cpu_attention.paged_decode_attention_cpu(q, kc, vc, t, torch.tensor(ctx, dtype=torch.int32), 0.25)

    contiguous = run(64, [[0], [1], [2]], 3)
    paged = run(8, [[9, 2, 14, 0, 5], [11], [1, 3, 4, 6, 7, 8, 10, 12]], 16)
    assert torch.equal(contiguous, paged)


@needs_kernel
def test_auto_sends_a_mixed_steps_decodes_to_the_c_kernel():
    ql, ctx = [1, 5, 1, 1, 7], [9, 12, 3, 30, 7]
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(1), ql, ctx, 4, 2, 3, 8)
    backend = attn.AttentionBackend()
    out = backend(q, kc, vc, meta, 0.3)
    assert backend.last_used == "c"
    torch.testing.assert_close(out, _naive(q, kc, vc, meta, 0.3), atol=1e-5, rtol=1e-5)
    half = attn.AttentionBackend()
    half(q.bfloat16(), kc.bfloat16(), vc.bfloat16(), meta, 0.3)
    assert half.last_used == "torch"  # float32 only: half precision stays on the reference


@needs_kernel
@pytest.mark.parametrize("ql, ctx", [([6, 3], [6, 3]),                        # prefill only
                                     ([1, 4, 1], [600, 4, 2]),                 # a long context: split
                                     ([1, 700], [3, 700])])                    # a long prompt: split
def test_auto_c_takes_prefill_chunks_as_queries_over_their_prefixes(monkeypatch, ql, ctx):
    calls = []
    real = cpu_attention.paged_decode_attention_cpu
    monkeypatch.setattr(cpu_attention, "paged_decode_attention_cpu", lambda *a: calls.append(a[4].tolist()) or real(*a))
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(6), ql, ctx, 16, 2, 2, 8)
    backend = attn.AttentionBackend()
    out = backend(q, kc, vc, meta, 0.3)
    torch.testing.assert_close(out, _naive(q, kc, vc, meta, 0.3), atol=1e-5, rtol=1e-5)
    if max(ctx) <= attn.C_PREFILL_MAX_CONTEXT:  # one call: every token, at its own position + 1
        assert calls == [[p + 1 for c, n in zip(ctx, ql) for p in range(c - n, c)]]
    else:  # the decodes alone; the prefill chunks went to the reference
        assert calls == [[c for c, n in zip(ctx, ql) if n == 1]]
    assert backend.last_used == "c"


@needs_kernel
def test_the_c_backend_asked_for_by_name():
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(2), [1, 1], [6, 2], 4, 1, 2, 8)
    backend = attn.AttentionBackend("c")
    torch.testing.assert_close(backend(q, kc, vc, meta, 0.5), _naive(q, kc, vc, meta, 0.5), atol=1e-5, rtol=1e-5)
    assert backend.last_used == "c"
    q2, kc2, vc2, meta2 = _random_batch(torch.Generator().manual_seed(2), [3], [3], 4, 1, 2, 8)
    with pytest.raises(RuntimeError, match="decode-only"):
        backend(q2, kc2, vc2, meta2, 0.5)
    with pytest.raises(RuntimeError, match="float32"):
        backend(q.double(), kc.double(), vc.double(), meta, 0.5)


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A clean slate: no kernel loaded in this process, an empty cache folder."""
    monkeypatch.setattr(cpu_attention, "_library", cpu_attention._library.fresh())
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("env, reason", [({"INFLIGHT_CPU_KERNEL": "0"}, "turned off"),
                                         ({"CC": "no-such-compiler-here"}, "no C compiler"),
                                         ({"CC": "false"}, "could not build")])
def test_without_a_kernel_auto_falls_back_to_the_reference(fresh_build, monkeypatch, env, reason):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cpu_attention.load() is None and reason in cpu_attention.build_error()
    assert cpu_attention.parallel_backend() is None
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(3), [1, 1], [5, 9], 4, 1, 2, 8)
    backend = attn.AttentionBackend()
    torch.testing.assert_close(backend(q, kc, vc, meta, 0.5), _naive(q, kc, vc, meta, 0.5), atol=1e-5, rtol=1e-5)
    assert backend.last_used == "torch"
    with pytest.raises(RuntimeError, match="can't be built"):
        attn.AttentionBackend("c")(q, kc, vc, meta, 0.5)
    with pytest.raises(RuntimeError, match="unavailable"):
        cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.5)


@needs_kernel
def test_the_kernel_is_built_once_into_the_cache_folder(fresh_build, monkeypatch):
    assert cpu_attention.load() is not None and cpu_attention.build_error() is None
    assert cpu_attention.parallel_backend() in ("inflight thread pool", "OpenMP", "one thread")
    built = list(fresh_build.glob("paged_decode-*.so"))
    assert len(built) == 1
    monkeypatch.setattr(cpu_attention, "_library", cpu_attention._library.fresh())  # a new process, say
    mtime = built[0].stat().st_mtime_ns
    assert cpu_attention.load() is not None and built[0].stat().st_mtime_ns == mtime  # reused, not rebuilt


@needs_kernel
@pytest.mark.parametrize("bad, match", [
    (lambda t, c: (t.fill_(999), c), "outside the cache"),          # a block that doesn't exist
    (lambda t, c: (t.fill_(-1), c), "outside the cache"),           # a negative block id
    (lambda t, c: (t, c.fill_(10**6)), "outside the cache"),        # longer than the block table covers
    (lambda t, c: (t, c.fill_(0)), "outside the cache"),            # an empty context
    (lambda t, c: (t[:1], c), "block_tables must be"),              # a table row short
])
def test_a_bad_block_table_is_an_error_that_names_it_not_a_crash(bad, match):
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(7), [1, 1], [5, 9], 4, 2, 2, 8)
    tables, lens = bad(meta.block_tables.clone(), meta.context_lens.clone())
    with pytest.raises(ValueError, match=match):
        cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, 0.5)


@needs_kernel
def test_the_side_by_side_bench_runs_both_and_compares_tokens(model):
    from inflight.bench.kernels import cpu as cpu_kernel

    step = cpu_kernel.attention_step_ms(model, batch=4, repeats=2)
    assert set(step) == {"torch", "c"} and all(t > 0 for t in step.values())
    e2e = cpu_kernel.end_to_end(model, n=4, repeats=1, prompt_range=(3, 10), output_mean=4, output_cap=8)
    assert len(e2e["tokens_per_s"]["c"]) == len(e2e["tokens_per_s"]["torch"]) == len(e2e["tokens_per_s"]["fused"]) == 1
    assert e2e["requests_with_identical_tokens"] == e2e["fused_requests_with_identical_tokens"] == 4
    assert model.attention_backend.name == "auto"  # the model's own backend is put back
    assert not fused_ops._state.get("off")  # and the fused passes are on again
    linear = cpu_kernel.linear_step_ms(model, rows=(1, 3), repeats=2)
    assert set(linear) == {"1", "3"} and all(set(t) == {"torch", "skinny"} and min(t.values()) > 0 for t in linear.values())
    text = cpu_kernel.report({"status": "ok", "batch": 4, "attention_step_ms": step, "attention_speedup": 1.0,
                              "linear_step_ms": linear, "skinny_max_rows": 64, "end_to_end": e2e})
    assert text.count("identical tokens on 4 of 4") == 2 and "up to 64 rows" in text
    assert "unavailable" in cpu_kernel.report({"status": "unavailable", "reason": "no C compiler"})


def test_the_cache_key_names_the_cpu_and_the_compiler(monkeypatch):
    from inflight.model import c_build

    base = c_build.library_path(cpu_attention.SOURCE, ["cc"], cpu_attention.FLAGS)
    monkeypatch.setattr(c_build, "cpu_id", lambda: "model name: another CPU\nflags: avx512f\n")
    assert c_build.library_path(cpu_attention.SOURCE, ["cc"], cpu_attention.FLAGS) != base
    assert c_build.library_path(cpu_attention.SOURCE, ["gcc", "-m64"], cpu_attention.FLAGS) != base


def test_editing_a_shared_header_rebuilds_the_kernels_that_include_it(tmp_path):
    from inflight.model import c_build

    (tmp_path / "k.c").write_text('#include "v.h"\nint f(void) { return V; }\n')
    (tmp_path / "v.h").write_text("#define V 1\n")
    before = c_build.library_path(tmp_path / "k.c", ["cc"], [])
    (tmp_path / "v.h").write_text("#define V 2\n")
    assert c_build.library_path(tmp_path / "k.c", ["cc"], []) != before


@pytest.mark.parametrize("cc, reason", [("true", "wrote nothing"), ("cc -O0 -DNOTHING", None)])
def test_compiler_commands_with_arguments_and_ones_that_write_nothing(fresh_build, monkeypatch, cc, reason):
    monkeypatch.setenv("CC", cc)
    lib = cpu_attention.load()
    if reason is None:  # a compiler command with arguments is a compiler, not "no C compiler"
        assert lib is not None or "no C compiler" not in (cpu_attention.build_error() or "")
    else:
        assert lib is None and reason in cpu_attention.build_error()
        assert not list(fresh_build.glob("*.so"))  # nothing half-made left in the cache
