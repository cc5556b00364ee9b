"""Graders for the sharing-and-fairness chapter: the chained block keys and cache hit of a prompt
(prefix caching), and the choice of the preemption victim (priorities).

`prefix_hit(token_ids, block_size, cached_keys) -> (keys, num_cached_tokens)`: the content keys of
every FULL block of the prompt, `key[i] = block_key(key[i-1], block_i_tokens)` with `key[-1] = ROOT_KEY`,
and how many prompt tokens the cache serves — the longest run of leading blocks whose keys are
cached, in whole blocks, and never the last prompt token.

`choose_victim(running) -> request_id` over `[(request_id, priority, arrival), ...]`: the lowest
priority (largest value), then the latest arrival; on a full tie the one listed last.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Hashable, Sequence

from inflight.engine.priority import choose_victim
from inflight.engine.prefix_cache import ROOT_KEY, block_key, block_keys
from inflight.exercises.answers import Flaw, as_int, as_list, call_unchanged, type_name
from inflight.exercises.grading import Case, Diagnosis, GradeResult, Mistake, grade, repeat_case

__all__ = ["prefix_hit", "check_prefix_hit", "choose_victim", "check_choose_victim"]


# --- prefix hit --------------------------------------------------------------------------------------
def prefix_hit(token_ids: Sequence[int], block_size: int, cached_keys) -> tuple[list[bytes], int]:
    """Reference: chained keys of the full blocks, and tokens served from the cache."""
    keys = block_keys(list(token_ids), block_size)
    hit = 0
    for k in keys:
        if k not in cached_keys:
            break
        hit += 1
    usable = (len(token_ids) - 1) // block_size  # leave the last token to compute
    return keys, min(hit, usable) * block_size


def _prefix_cases() -> list[Case]:
    rng = random.Random("prefix-hit")
    system = [rng.randrange(1, 50) for _ in range(12)]
    specs = []

    def cache_of(*prompts, bs):
        keys = set()
        for p in prompts:
            keys.update(block_keys(p, bs))
        return keys

    # the chapter's example: a 12-token system prompt seen before, blocks of 4
    seen = system + [60, 61, 62]
    specs.append(("shared system prompt", system + [70, 71, 72, 73, 74], 4, cache_of(seen, bs=4)))
    specs.append(("nothing cached", system + [1, 2], 4, set()))
    specs.append(("prompt exactly the cached blocks", list(system), 4, cache_of(system, bs=4)))
    specs.append(("prompt one token past the cached blocks", system + [5], 4, cache_of(system, bs=4)))
    specs.append(("shorter than a block", [3, 4, 5], 4, cache_of([3, 4, 5, 6], bs=4)))
    specs.append(("one token", [7], 4, cache_of([7, 1, 2, 3], bs=4)))
    # same tokens in block 1, different block 0: no sharing of block 1
    other = [99, 98, 97, 96] + system[4:] + [1]
    specs.append(("same block after a different prefix", system[:0] + other, 4, cache_of(system + [0], bs=4)))
    # a gap: block 0 cached, block 1 not, block 2's key cached (from an identical earlier prompt, then evicted block 1)
    gap_prompt = system + [8, 8]
    keys = block_keys(gap_prompt, 4)
    specs.append(("a cached block after a miss", gap_prompt, 4, {keys[0], keys[2]}))
    specs.append(("block size 1", [5, 6, 7, 8], 1, cache_of([5, 6, 7, 8, 9], bs=1)))
    specs.append(("block size 1, partial hit", [5, 6, 1, 8], 1, cache_of([5, 6, 7, 8], bs=1)))
    specs.append(("long prompt, big blocks", [rng.randrange(50) for _ in range(70)], 16, set()))
    long = [rng.randrange(50) for _ in range(64)]
    specs.append(("exactly four blocks, all cached", long, 16, cache_of(long, bs=16)))
    specs.append(("four blocks + 3, all cached", long + [1, 2, 3], 16, cache_of(long + [1, 2, 3, 4] * 4, bs=16)))
    for k in range(14):
        bs = rng.choice([2, 3, 4, 8])
        base = [rng.randrange(6) for _ in range(rng.randint(0, 20))]
        earlier = [base + [rng.randrange(6) for _ in range(rng.randint(0, 10))] for _ in range(rng.randint(0, 3))]
        prompt = base + [rng.randrange(6) for _ in range(rng.randint(1, 12))]
        specs.append((f"random #{k}", prompt, bs, cache_of(*earlier, bs=bs)))
    specs.append(("exactly one block, cached", [4, 5, 6, 7], 4, cache_of([4, 5, 6, 7, 8], bs=4)))
    specs.append(("exactly two blocks, the first cached", system[:8], 4, cache_of(system[:4], bs=4)))
    specs.append(("a block bigger than the prompt", [1, 2, 3, 4, 5], 8, cache_of([1, 2, 3, 4, 5, 6, 7, 8], bs=8)))
    cases = [Case(name, lambda f, p=prompt, bs=bs, c=cached: _prefix(f, p, bs, c),
                  f"{len(prompt)} prompt tokens, block_size={bs}, {len(cached)} keys cached",
                  tags=_prefix_tags(prompt, bs, cached), fields=("keys", "num_cached_tokens"),
                  data=(tuple(prompt), bs, frozenset(cached)))
             for name, prompt, bs, cached in specs]
    return cases + [repeat_case(cases)]


def _prefix(f: Callable, prompt: list, bs: int, cached: set) -> tuple[list[str], int]:
    out = call_unchanged(f, [list(prompt), bs, frozenset(cached)], ["token_ids", "block_size", "cached_keys"],
                         "token_ids is the request's prompt.")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise Flaw(f"returned {type_name(out)}", f"{out!r:.80}", f"prefix_hit returned {type_name(out)}"
                   f"{'' if not isinstance(out, (tuple, list)) else f' of {len(out)} items'}; return the pair "
                   "(keys, num_cached_tokens).", first=True)
    keys = as_list(out[0], "the keys", "they are a list of the block keys, in block order")
    for i, k in enumerate(keys):
        if not isinstance(k, bytes):
            raise Flaw("keys that are not bytes", f"key {i} is {k!r:.60} ({type_name(k)})",
                       f"key {i} is {type_name(k)}; each key is the bytes `block_key(parent_key, block_tokens)` "
                       "returns (a stable SHA-256 digest, not Python's hash()).", first=True)
    n = as_int(out[1], "num_cached_tokens", "a number of tokens is an int")
    # keys shown as their first 8 hex digits: 32-byte digests printed whole would push the token
    # count, often the only difference, past the end of the report's line
    return [k.hex()[:8] for k in keys], n


def _prefix_tags(prompt: list, bs: int, cached: set) -> frozenset:
    keys = block_keys(list(prompt), bs)
    hits = [k in cached for k in keys]
    tags = set()
    if len(prompt) % bs == 0 and hits and all(hits):
        tags.add("all cached, no tail")
    if len(prompt) % bs:
        tags.add("partial tail")
    if False in hits and any(hits[hits.index(False) + 1:]):
        tags.add("hit after a miss")
    if len(prompt) < bs:
        tags.add("shorter than a block")
    return frozenset(tags)


PREFIX_TAGS = {
    "all cached, no tail": ("the whole prompt is cached and ends exactly on a block boundary",
                            "the last prompt token must still be computed, and the cache serves whole blocks: "
                            "cap the hit at (len(token_ids) - 1) // block_size blocks."),
    "partial tail": ("the prompt ends with a partly filled block",
                     "only full blocks get a key: the partial tail has none."),
    "hit after a miss": ("a block is cached after one that is not",
                         "the hit is the LEADING run of cached blocks: stop at the first miss."),
    "shorter than a block": ("the prompt is shorter than one block", "no full block: no keys, nothing cached."),
}


def _prefix_count(failures: list) -> Diagnosis | None:
    """With every key right: how the learner's token count relates to the hit and the cap."""
    found = []
    for case, expected, got in failures:
        prompt, bs, cached = case.data
        hit = 0
        for k in block_keys(list(prompt), bs):
            if k not in cached:
                break
            hit += 1
        cap = (len(prompt) - 1) // bs
        n = got[1]
        if n % bs:
            why = (f"{n} is not a whole number of blocks of {bs}: the cache hands out whole blocks, so the count is "
                   "hit blocks × block_size")
        elif n // bs > hit:
            why = (f"you serve {n // bs} block(s) but only the first {hit} are a leading run of cached blocks: stop at "
                   "the first miss")
        elif n // bs > cap:
            why = (f"you serve {n // bs} block(s) of a {len(prompt)}-token prompt, which leaves no token to compute: "
                   f"cap the hit at (len(token_ids) - 1) // block_size = {cap} blocks")
        else:
            why = (f"you serve {n // bs} block(s) where {min(hit, cap)} are cached and allowed ({hit} leading blocks hit, "
                   f"the cap is (len(token_ids) - 1) // block_size = {cap}): serve min(hit, cap) blocks")
        found.append((case, why))
    kinds = {why.split(":")[0].split(" ")[-1] for _, why in found}
    case, why = found[0]
    return Diagnosis("your keys are right, the token count is not",
                     f"every key you return is right; on '{case.name}' {why}." +
                     ("" if len(kinds) == 1 else " (Your other failing cases go wrong in other ways: compare them.)"),
                     case)


def _prefix_keys(candidate: Any, failures: list) -> Diagnosis | None:
    """Where the learner's keys first go wrong, or, with every key right, what is wrong with the count."""
    mine = [(c, e, g) for c, e, g in failures if isinstance(g, tuple) and c.data is not None]
    if mine and all(e[0] == g[0] for _, e, g in mine):
        return _prefix_count(mine)
    for case, expected, got in failures:
        if not isinstance(got, tuple) or case.data is None:
            continue
        want, have = expected[0], got[0]
        if want == have:
            continue
        prompt, bs, _ = case.data
        if len(have) != len(want):
            return Diagnosis("the wrong number of keys",
                             f"for {len(prompt)} tokens in blocks of {bs} you return {len(have)} key(s); there is one "
                             f"key per FULL block: len(token_ids) // block_size = {len(want)}.", case)
        i = next(i for i, (a, b) in enumerate(zip(want, have)) if a != b)
        if i == 0:
            return Diagnosis("the first key is wrong",
                             "key 0 is block_key(ROOT_KEY, token_ids[:block_size]): ROOT_KEY as the parent, and the "
                             "first block's tokens only.", case)
        return Diagnosis(f"key {i} is wrong while key 0 is right",
                         f"each key chains its parent: key {i} = block_key(key {i - 1}, token_ids[{i} * block_size : "
                         f"{i + 1} * block_size]) — the previous KEY as parent, and this block's tokens only.", case)
    return None


def _mk_unchained(tokens, bs, cached):
    keys = [block_key(ROOT_KEY, tokens[i:i + bs]) for i in range(0, len(tokens) - bs + 1, bs)]
    return keys, _hit(keys, cached, (len(tokens) - 1) // bs) * bs


def _hit(keys, cached, usable):
    n = 0
    for k in keys:
        if k not in cached:
            break
        n += 1
    return min(n, usable)


def _mk_partial(tokens, bs, cached):
    keys, parent = [], ROOT_KEY
    for i in range(0, len(tokens), bs):
        parent = block_key(parent, tokens[i:i + bs])
        keys.append(parent)
    return keys, _hit(keys, cached, (len(tokens) - 1) // bs) * bs


def _mk_no_keep(tokens, bs, cached):
    keys = block_keys(tokens, bs)
    return keys, _hit(keys, cached, len(keys)) * bs


def _mk_no_stop(tokens, bs, cached):
    keys = block_keys(tokens, bs)
    return keys, min(sum(k in cached for k in keys), (len(tokens) - 1) // bs) * bs


def _mk_blocks(tokens, bs, cached):
    keys = block_keys(tokens, bs)
    return keys, _hit(keys, cached, (len(tokens) - 1) // bs)


def _mk_drop_one(tokens, bs, cached):
    keys = block_keys(tokens, bs)
    return keys, max(0, _hit(keys, cached, len(keys)) - 1) * bs


def _mk_prefix_tokens(tokens, bs, cached):
    keys = [block_key(ROOT_KEY, tokens[:i + bs]) for i in range(0, len(tokens) - bs + 1, bs)]
    return keys, _hit(keys, cached, (len(tokens) - 1) // bs) * bs


def _mk_unaligned(tokens, bs, cached):
    keys = block_keys(tokens, bs)
    return keys, min(_hit(keys, cached, len(keys)) * bs, len(tokens) - 1)


PREFIX_MISTAKES = [
    Mistake("keying a block without its prefix", "each key must chain in the PARENT's key: "
            "`key = block_key(parent_key, block_tokens)`. A block's keys and values depend on every token before "
            "it, so equal tokens after a different prefix are different content and must not be shared.",
            _mk_unchained),
    Mistake("caching a partial block", "only FULL blocks get a key: a partly filled last block is still being "
            "written (the next tokens land in it), so no other request may share it.", _mk_partial),
    Mistake("forgetting to keep one token to recompute", "when the whole prompt is cached you still have to run "
            "the model on at least its last token — that forward pass produces the logits the first generated "
            "token is sampled from. Cap the hit at `(len(prompt) - 1) // block_size` blocks.", _mk_no_keep),
    Mistake("counting hits after a miss", "the hit is the longest run of LEADING cached blocks: after the first "
            "miss, later blocks must be recomputed anyway (their attention reads the missing block).", _mk_no_stop),
    Mistake("blocks instead of tokens", "return the number of cached TOKENS (hit blocks × block_size), not blocks.",
            _mk_blocks),
    Mistake("keeping one token but not whole blocks", "`min(hit_tokens, len(prompt) - 1)` lands mid-block: the "
            "cache only hands out whole blocks, and the recomputed tail would overwrite a shared block. Round the "
            "hit down to whole blocks: `min(hit_blocks, (len(prompt) - 1) // block_size) * block_size`.",
            _mk_unaligned),
    Mistake("always giving back the last hit block", "keep one token to compute only when the hit would cover the "
            "whole prompt: the cap is `(len(prompt) - 1) // block_size` blocks, not one block less than every hit.",
            _mk_drop_one),
    Mistake("keying a block by the whole prefix's tokens", "chain the keys: `block_key(parent_key, block_tokens)` "
            "with the PREVIOUS BLOCK'S KEY as parent and only this block's tokens — hashing all the tokens so far "
            "names the same prefix but not with the keys the cache stores.", _mk_prefix_tokens),
]


def check_prefix_hit(fn: Callable[[list, int, frozenset], tuple], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(token_ids, block_size, cached_keys) -> (keys, num_cached_tokens)`."""
    return grade("prefix_hit", fn, prefix_hit, _prefix_cases(), PREFIX_MISTAKES, quiet=quiet, explain=_prefix_keys,
                 tags=PREFIX_TAGS)


# --- preemption victim -------------------------------------------------------------------------------
def _victim_cases() -> list[Case]:
    specs = [
        ("the chapter's example", [("A", 0, 0.0), ("B", 1, 1.0), ("C", 1, 2.0), ("D", 0, 3.0)]),
        ("lowest priority arrived first", [("old-low", 2, 0.0), ("new-high", 0, 5.0), ("mid", 1, 9.0)]),
        ("equal priorities: FIFO's victim", [("a", 0, 3.0), ("b", 0, 1.0), ("c", 0, 2.0)]),
        ("admitted out of arrival order", [("x", 1, 4.0), ("y", 1, 7.0), ("z", 1, 5.0), ("w", 0, 9.0)]),
        ("one request", [("only", 3, 2.0)]),
        ("negative priorities", [("vip", -5, 8.0), ("normal", 0, 1.0), ("also", 0, 0.5)]),
        ("a full tie", [("first", 1, 2.0), ("second", 1, 2.0), ("high", 0, 3.0)]),
        ("priorities above 9", [("p10", 10, 1.0), ("p9", 9, 2.0)]),
        ("latest arrival is the most important", [("a", 2, 0.0), ("b", 2, 1.0), ("c", 0, 9.0)]),
    ]
    rng = random.Random("victim")
    for k in range(20):
        n = rng.randint(2, 8)
        arrivals = rng.sample(range(50), n)
        specs.append((f"random #{k}", [(f"r{i}", rng.randint(0, 3), float(arrivals[i])) for i in range(n)]))
    specs += [("integer ids", [(3, 1, 0.5), (1, 1, 0.7), (2, 0, 0.9)]),
              ("a full tie of three", [("u", 2, 1.0), ("v", 2, 1.0), ("w", 2, 1.0)])]
    cases = [Case(name, lambda f, r=r: _victim(f, r), "running = " + ", ".join(f"{i}(prio {p}, arr {a:g})"
                                                                              for i, p, a in r),
                  tags=_victim_tags(r)) for name, r in specs]
    return cases + [repeat_case(cases)]


def _victim(f: Callable, running: list) -> Hashable:
    got = call_unchanged(f, [[tuple(x) for x in running]], ["running"],
                         "running is the engine's own list of running requests, in admission order.")
    ids = [rid for rid, _, _ in running]
    if got in ids and not isinstance(got, bool):
        return got
    if isinstance(got, tuple) and got in [tuple(x) for x in running]:
        raise Flaw("returned the whole tuple", f"{got!r}", "choose_victim returns the request_id of the victim, "
                   "not its (request_id, priority, arrival) tuple: return victim[0].", first=True)
    if isinstance(got, int) and not isinstance(got, bool) and 0 <= got < len(running) and got not in ids:
        raise Flaw("returned a position in the list", f"{got!r} (running[{got}] is {running[got][0]!r})",
                   "choose_victim returns the victim's request_id, not its index in `running`: return "
                   "running[i][0].", first=True)
    return got


def _victim_tags(running: list) -> frozenset:
    tags = set()
    keys = [(p, a) for _, p, a in running]
    worst = max(p for _, p, _ in running)
    if keys.count(max(keys)) > 1:
        tags.add("full tie")
    if sum(p == worst for _, p, _ in running) > 1:
        tags.add("priority tie")
    if [a for _, _, a in running] != sorted(a for _, _, a in running):
        tags.add("out of order")
    if any(p < 0 for _, p, _ in running):
        tags.add("negative")
    return frozenset(tags)


VICTIM_TAGS = {
    "full tie": ("two requests share both the lowest priority and the latest arrival",
                 "on a full tie the victim is the one listed LAST: `max` keeps the first of equal keys, so add the "
                 "position to the key (or compare with >=)."),
    "priority tie": ("several requests share the lowest priority",
                     "among them, the latest ARRIVAL is the victim (its arrival time, not its place in the list)."),
    "out of order": ("the list is not in arrival order (preempted requests came back)",
                     "compare arrival times; the position in the list is admission order, not arrival."),
    "negative": ("some priorities are negative", "lower value = more important, also below 0: the victim has the "
                 "LARGEST value."),
}


VICTIM_MISTAKES = [
    Mistake("earliest instead of latest arrival", "among the lowest-priority requests, preempt the LATEST arrival: "
            "first come, first served — the earliest arrivals run first, so no request is sent back while a later "
            "one of its priority keeps running.",
            lambda r: max(enumerate(r), key=lambda ix: (ix[1][1], -ix[1][2], ix[0]))[1][0]),
    Mistake("highest instead of lowest priority", "a LOWER priority value means MORE important (vLLM's "
            "convention); the victim has the LARGEST value.",
            lambda r: max(enumerate(r), key=lambda ix: (-ix[1][1], ix[1][2], ix[0]))[1][0]),
    Mistake("priority ignored", "the latest arrival is the victim only among requests of the lowest priority; "
            "compare priorities first.", lambda r: max(enumerate(r), key=lambda ix: (ix[1][2], ix[0]))[1][0]),
    Mistake("arrival ignored", "several requests can share the lowest priority: break the tie by arrival "
            "(latest first), not by where they sit in the list.",
            lambda r: max(r, key=lambda x: x[1])[0]),
    Mistake("a full tie goes to the first listed", "on a full tie (same priority, same arrival) the victim is "
            "the one listed LAST (admitted last): `max` keeps the first of equal keys, so add the position "
            "to the key or scan for >=.",
            lambda r: max(r, key=lambda x: (x[1], x[2]))[0]),
    Mistake("the last one admitted", "the running list is in admission order, and preempted requests come back "
            "later: the last in the list is not necessarily the lowest priority or the latest arrival.",
            lambda r: r[-1][0]),
    Mistake("the oldest request", "preempting the request that arrived FIRST sends back the one that has waited "
            "longest, and ignores priority: the victim is the lowest priority, latest arrival.",
            lambda r: min(enumerate(r), key=lambda ix: (ix[1][2], ix[0]))[1][0]),
    Mistake("list position instead of arrival", "among the lowest-priority requests the victim is the latest "
            "ARRIVAL; the list is in admission order, and a preempted request that came back sits late in it "
            "although it arrived early. Compare arrival times.",
            lambda r: max(enumerate(r), key=lambda ix: (ix[1][1], ix[0]))[1][0]),
    Mistake("the request to serve next", "that is the request the scheduler would ADMIT first (most important, "
            "earliest): preemption takes the opposite end — largest priority value, then latest arrival.",
            lambda r: min(enumerate(r), key=lambda ix: (ix[1][1], ix[1][2], ix[0]))[1][0]),
]


def check_choose_victim(fn: Callable[[list], Hashable], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(running) -> request_id` over `running = [(request_id, priority, arrival), ...]`."""
    return grade("choose_victim", fn, choose_victim, _victim_cases(), VICTIM_MISTAKES, quiet=quiet, tags=VICTIM_TAGS)
