"""Prefix caching: chained block keys, the key -> block map, LRU eviction of freed cached blocks,
(hypothesis) random interleavings that never leave a block both free and owned; and, end to end,
greedy outputs identical with prefix caching on and off."""
import random

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inflight.engine.block_manager import BlockAllocator, NoFreeBlocksError
from inflight.engine.prefix_cache import (PrefixCachingBlockAllocator, block_key, block_keys, cacheable_prefix_len,
                                   ROOT_KEY)


# -- keys ---------------------------------------------------------------------------------------
def test_keys_are_chained_over_the_whole_prefix():
    a = block_keys([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_keys([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert len(a) == len(b) == 2
    assert a[1] != b[1], "same block tokens after a different prefix must get a different key"
    assert a[0] == block_key(ROOT_KEY, [1, 2, 3, 4]) and a[1] == block_key(a[0], [5, 6, 7, 8])
    assert block_keys([1, 2, 3, 4, 5, 6, 7], 4) == a[:1], "a partial block has no key"
    assert block_keys([1, 2, 3], 4) == []
    assert block_keys([1, 2, 3, 4], 4) == block_keys([1, 2, 3, 4], 4), "keys are stable"
    assert isinstance(a[0], bytes) and len(a[0]) == 32  # sha256, not the salted hash()


def test_key_is_not_ambiguous_about_token_boundaries():
    assert block_key(ROOT_KEY, [1, 23]) != block_key(ROOT_KEY, [12, 3])
    assert block_key(ROOT_KEY, [256]) != block_key(ROOT_KEY, [1, 0])


def test_bad_key_input():
    with pytest.raises(ValueError, match="block_size"):
        block_keys([1, 2], 0)
    with pytest.raises(TypeError, match="ints"):
        block_key(ROOT_KEY, ["a"])


def test_cacheable_prefix_len_keeps_the_last_token():
    assert cacheable_prefix_len(8, 2, 4) == 4   # prompt of exactly two blocks: recompute the second
    assert cacheable_prefix_len(9, 2, 4) == 8
    assert cacheable_prefix_len(9, 1, 4) == 4
    assert cacheable_prefix_len(1, 5, 4) == 0
    assert cacheable_prefix_len(0, 0, 4) == 0


# -- the allocator ------------------------------------------------------------------------------
def _fill(a, tokens):
    """Allocate blocks for `tokens`, cache the full ones (what the engine does after a prefill)."""
    table = a.allocate(a.blocks_needed(len(tokens)))
    for b, k in zip(table, block_keys(tokens, a.block_size)):
        a.cache_block(b, k)
    return table


def test_is_a_block_allocator():
    a = PrefixCachingBlockAllocator(8, 4)
    assert isinstance(a, BlockAllocator)
    assert (a.num_free, a.num_used, a.num_cached) == (8, 0, 0)


def test_hit_shares_blocks_by_reference_count():
    a = PrefixCachingBlockAllocator(16, 4)
    system = list(range(1, 13))  # three full blocks
    t1 = _fill(a, system + [20, 21])
    blocks, n = a.find_cached_prefix(system + [30, 31, 32])
    assert blocks == t1[:3] and n == 12
    a.acquire(blocks)
    assert [a.ref_count(b) for b in t1] == [2, 2, 2, 1]
    a.check_invariants()
    # a different first block: nothing is shared, even though later blocks have equal tokens
    assert a.find_cached_prefix([0, 2, 3, 4] + system[4:] + [1]) == ([], 0)


def test_lookup_is_pure_and_never_covers_the_last_token():
    a = PrefixCachingBlockAllocator(8, 4)
    p = [5, 6, 7, 8, 9, 10, 11, 12]
    _fill(a, p)
    before = (a.num_free, a.num_cached, [a.ref_count(b) for b in range(8)])
    assert a.find_cached_prefix(p) == ([0], 4), "a prompt that is all cached still recomputes its last block"
    assert a.find_cached_prefix(p + [1]) == ([0, 1], 8)
    assert a.find_cached_prefix([]) == ([], 0)
    assert before == (a.num_free, a.num_cached, [a.ref_count(b) for b in range(8)])


def test_freed_cached_blocks_stay_findable_until_evicted_lru():
    a = PrefixCachingBlockAllocator(4, 2)
    x = _fill(a, [1, 2, 3, 4])        # 2 cached blocks
    y = _fill(a, [7, 8])              # 1 cached block
    a.free(x)
    a.free(y)
    assert a.num_free == 4 and a.num_evictable == 3 and a.num_used == 0
    assert a.find_cached_prefix([1, 2, 3, 4, 9]) == (x, 4)
    # one never-keyed free block is used before any cached block is evicted
    z = a.allocate(1)
    assert a.num_evictable == 3 and a.stats.evictions == 0
    # now evictions: least recently freed first; x was freed deepest block first, then y
    w = a.allocate(1)
    assert w == [x[1]] and a.stats.evictions == 1
    assert a.find_cached_prefix([1, 2, 3, 4, 9]) == ([x[0]], 2), "the parent survives its evicted child"
    a.allocate(2)
    assert a.num_cached == 0 and a.num_free == 0
    with pytest.raises(NoFreeBlocksError):
        a.allocate(1)
    a.free(z)
    a.check_invariants()


def test_acquire_revives_an_evictable_block_and_protects_it():
    a = PrefixCachingBlockAllocator(3, 2)
    x = _fill(a, [1, 2, 3, 4])
    a.free(x)
    blocks, n = a.find_cached_prefix([1, 2, 3, 4, 5])
    assert a.blocks_to_revive(blocks) == 2
    a.acquire(blocks)
    assert a.num_free == 1 and a.num_evictable == 0
    new = a.allocate(1)
    assert new not in x and a.num_cached == 2, "allocating the rest must not evict the hit"
    a.check_invariants()
    with pytest.raises(ValueError, match="not cached"):
        a.acquire(new)


def test_duplicate_content_is_not_cached_twice():
    a = PrefixCachingBlockAllocator(8, 2)
    x = _fill(a, [1, 2])
    y = a.allocate(1)
    assert not a.cache_block(y[0], a.key_of(x[0]))
    assert a.key_of(y[0]) is None and a.num_cached == 1
    a.free(y)
    assert a.num_evictable == 0, "an uncached block goes back to the plain free list"
    with pytest.raises(ValueError, match="free block"):
        a.cache_block(y[0], b"k")


def test_stats_and_reset():
    a = PrefixCachingBlockAllocator(8, 2)
    a.record_lookup(9, 4)
    a.record_lookup(5, 0)
    assert (a.stats.requests, a.stats.requests_hit, a.stats.query_tokens, a.stats.hit_tokens) == (2, 1, 12, 4)
    assert a.stats.hit_rate == pytest.approx(4 / 12)
    x = _fill(a, [1, 2, 3])
    a.free(x)
    assert a.num_evictable == 1
    a.reset_cache()
    assert a.num_evictable == 0 and a.num_cached == 0 and a.num_free == 8
    a.check_invariants()


class CacheMachine(RuleBasedStateMachine):
    """Requests over a small vocabulary (so prefixes collide) come and go: look up, acquire, allocate
    the rest, cache full blocks, free. After every rule: no block both free and owned, reference
    counts equal the number of holders, free + in use = total, a cached block holds its key's tokens."""

    def __init__(self):
        super().__init__()
        self.a = PrefixCachingBlockAllocator(12, 2)
        self.held: list[tuple[list[int], list[int]]] = []  # (tokens, block table) of live requests
        self.content: dict[int, tuple] = {}  # block -> the prefix tokens it was cached with

    @rule(data=st.data())
    def admit(self, data):
        tokens = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=9))
        blocks, n = self.a.find_cached_prefix(tokens)
        assert n <= len(tokens) - 1 and n == 2 * len(blocks)
        for i, b in enumerate(blocks):
            assert self.content[b] == tuple(tokens[:2 * (i + 1)]), "hit on a block with other content"
        rest = self.a.blocks_needed(len(tokens)) - len(blocks)
        if rest + self.a.blocks_to_revive(blocks) > self.a.num_free:
            return
        self.a.acquire(blocks)
        table = blocks + self.a.allocate(rest)
        keys = block_keys(tokens, 2)
        for i, (b, k) in enumerate(zip(table, keys)):
            if self.a.cache_block(b, k):
                self.content[b] = tuple(tokens[:2 * (i + 1)])
        self.held.append((tokens, table))

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def release(self, i):
        _, table = self.held.pop(i % len(self.held))
        self.a.free(table)

    @invariant()
    def books_balance(self):
        self.a.check_invariants()
        owners: dict[int, int] = {}
        for _, table in self.held:
            for b in table:
                owners[b] = owners.get(b, 0) + 1
        for b in range(self.a.num_blocks):
            assert self.a.ref_count(b) == owners.get(b, 0)
        assert self.a.num_free + len(owners) == self.a.num_blocks
        free = set(self.a._free) | set(self.a._evictable)
        assert not free & set(owners), "a block is both free and owned"
        for b in range(self.a.num_blocks):
            if self.a.key_of(b) is not None:
                assert self.a.key_of(b) == block_keys(list(self.content[b]), 2)[-1]


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# -- end to end: the engine with prefix caching --------------------------------------------------

from inflight.engine.llm_engine import LLMEngine  # noqa: E402
from inflight.engine.sampling import SamplingParams  # noqa: E402

VOCAB = 61



def _shared_prompts(n, seed, system_len=13, lo=1, hi=9, share=0.75):
    """Most prompts start with one of two system prompts; the rest are unrelated."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, VOCAB) for _ in range(system_len)] for _ in range(2)]
    out = []
    for _ in range(n):
        head = rng.choice(systems) if rng.random() < share else []
        out.append(head + [rng.randrange(1, VOCAB) for _ in range(rng.randint(lo, hi))])
    return out


def _run(model, prompts, params, **kw):
    engine = LLMEngine(model, debug=True, **kw)
    return engine, engine.generate(prompts, params, use_tqdm=False)


def test_second_request_reuses_the_first_ones_blocks(model):
    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=32, enable_prefix_caching=True, debug=True)
    p = list(range(1, 11))  # 10 tokens: two full blocks
    first = engine.generate([p], sp, use_tqdm=False)[0]
    second = engine.generate([p], sp, use_tqdm=False)[0]
    exact = engine.generate([p[:8]], sp, use_tqdm=False)[0]   # exactly two blocks: the last one is recomputed
    assert (first.num_cached_tokens, second.num_cached_tokens, exact.num_cached_tokens) == (0, 8, 4)
    assert first.token_ids == second.token_ids
    assert [s.num_prefill_tokens for s in engine.stats if s.num_prefill_tokens] == [10, 2, 4]
    stats = engine.prefix_cache_stats()
    assert stats["prefix_cache_hits"] == 2 and stats["prefix_cache_hit_tokens"] == 12
    assert engine.allocator.num_used == 0 and engine.allocator.num_evictable > 0
    engine.reset_prefix_cache()
    assert engine.generate([p], sp, use_tqdm=False)[0].num_cached_tokens == 0


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("chunked", [True, False])
def test_greedy_identical_with_caching_on_and_off_under_pressure(model, preemption, chunked):
    prompts = _shared_prompts(14, seed=3)
    rng = random.Random(4)
    params = [SamplingParams(max_tokens=rng.randint(1, 16), ignore_eos=True) for _ in prompts]
    kw = dict(block_size=4, num_blocks=16, max_batch_size=6, max_batched_tokens=16 if chunked else 40,
              preemption=preemption, enable_chunked_prefill=chunked)
    off_engine, off = _run(model, prompts, params, **kw)
    on_engine, on = _run(model, prompts, params, enable_prefix_caching=True, **kw)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    s_on, s_off = on_engine.summary(), off_engine.summary()
    assert s_on["prefix_cache_hit_tokens"] > 0 and s_on["prefill_tokens"] < s_off["prefill_tokens"]
    assert s_on["preemptions"] > 0 and s_on["prefix_cache_evictions"] > 0, "the pool should be under pressure"
    assert on_engine.allocator.num_used == 0 and on_engine.allocator.num_free == on_engine.num_blocks
    on_engine.allocator.check_invariants()


def test_same_block_after_a_different_prefix_is_not_shared(model):
    # [A, Y] and [C, X] are cached; [A, X] may reuse A but not X: X's keys/values depend on what came before
    A, C, X, Y = [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18, 19, 20]
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [A + Y + [1], C + X + [1], A + X + [1]]
    engine = LLMEngine(model, block_size=4, num_blocks=32, max_batch_size=1, enable_prefix_caching=True, debug=True)
    outs = [engine.generate([p], sp, use_tqdm=False)[0] for p in prompts]
    assert [o.num_cached_tokens for o in outs] == [0, 0, 4]
    _, off = _run(model, prompts, sp, block_size=4, num_blocks=32)
    assert [o.token_ids for o in outs] == [o.token_ids for o in off]


def test_evicted_block_is_recomputed_identically(model):
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    system = [7, 3, 9, 12, 44, 5, 6, 18, 2]
    engine = LLMEngine(model, block_size=4, num_blocks=8, max_batch_size=1, enable_prefix_caching=True, debug=True)
    a = engine.generate([system + [1]], sp, use_tqdm=False)[0]
    # unrelated traffic flushes the small pool: the system prompt's blocks are evicted
    rng = random.Random(0)
    engine.generate([[rng.randrange(1, VOCAB) for _ in range(20)] for _ in range(3)], sp, use_tqdm=False)
    assert engine.prefix_cache_stats()["prefix_cache_evictions"] >= 2
    b = engine.generate([system + [1]], sp, use_tqdm=False)[0]
    assert b.num_cached_tokens < 8 and b.token_ids == a.token_ids
    c = engine.generate([system + [1]], sp, use_tqdm=False)[0]  # ... and cached again
    assert c.num_cached_tokens == 8 and c.token_ids == a.token_ids


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preempted_request_hits_the_cache_when_it_comes_back(model, preemption):
    # prompts share nothing (a 4-token block collides with chance 1/61^4): any hit is a request finding
    # its OWN blocks again after a preemption
    rng = random.Random(11)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(9, 14))] for _ in range(6)]
    params = [SamplingParams(max_tokens=14, ignore_eos=True)] * len(prompts)
    kw = dict(block_size=4, num_blocks=14, max_batch_size=4, max_batched_tokens=16, preemption=preemption)
    _, off = _run(model, prompts, params, **kw)
    engine, on = _run(model, prompts, params, enable_prefix_caching=True, **kw)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    if preemption == "recompute":
        back = [o for o in on if o.num_preemptions > 0 and o.num_cached_tokens > 0]
        assert back, "a preempted request should find some of its blocks still cached"
    assert engine.summary()["preemptions"] > 0


@pytest.mark.parametrize("seed", range(4))
def test_random_shared_workloads_identical(model, seed):
    prompts = _shared_prompts(10, seed=100 + seed, system_len=random.Random(seed).randint(3, 17), share=0.9)
    rng = random.Random(seed)
    params = [SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True) for _ in prompts]
    bs = rng.choice([2, 4, 8])
    kw = dict(block_size=bs, num_blocks=rng.randint(80, 120) // bs, max_batch_size=rng.randint(2, 6),
              max_batched_tokens=rng.choice([8, 16, 64]))
    _, off = _run(model, prompts, params, **kw)
    _, on = _run(model, prompts, params, enable_prefix_caching=True, **kw)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]


def test_tiny_model_identical_with_caching():
    from inflight.model.loading import load_tiny

    try:
        tiny, tok = load_tiny()
    except FileNotFoundError:
        pytest.skip("the shipped tiny model is not there yet")
    system = "def add(a, b):\n    return a + b\n\ndef "
    texts = [system + s for s in ("mul(a, b):", "sub(a, b):", "neg(a):", "mul(a, b):")]
    sp = SamplingParams(max_tokens=12)
    kw = dict(tokenizer=tok, block_size=8, num_blocks=24, max_batch_size=2, max_batched_tokens=32)
    _, off = _run(tiny, texts, sp, **kw)
    engine, on = _run(tiny, texts, sp, enable_prefix_caching=True, **kw)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert engine.prefix_cache_stats()["prefix_cache_hit_tokens"] > 0


def test_caching_needs_the_caching_allocator():
    from inflight.engine.scheduler import Scheduler, SchedulerConfig

    with pytest.raises(ValueError, match="PrefixCachingBlockAllocator"):
        Scheduler(BlockAllocator(4, 4), SchedulerConfig(max_batch_size=1, max_batched_tokens=4, enable_prefix_caching=True))


def test_bench_prefix_plumbing(model):
    from inflight.bench.offline import prefix as bench_prefix

    res = bench_prefix.collect(model, n=6, system_len=12, user_len=3, output_len=3, block_size=4, max_batch_size=3)
    sh, no = res["workloads"]["shared_system_prompt"], res["workloads"]["share_nothing"]
    assert sh["outputs_identical"] and no["outputs_identical"]
    assert sh["on"]["prefill_tokens"] < sh["off"]["prefill_tokens"] == no["off"]["prefill_tokens"] == 6 * 15
    assert sh["on"]["hit_rate"] > 0.5 and no["on"]["hit_rate"] == 0
    assert "prefill" in bench_prefix.report(res)
    with pytest.raises(TypeError, match="unknown"):
        bench_prefix.collect(model, n=2, bogus=1)
    with pytest.raises(ValueError, match="context"):
        bench_prefix.collect(model, n=2, system_len=200)
