"""The sharing graders accept correct code (several styles) and reject independently written wrong
implementations with the right explanation. Mutants are written here, not imported from the package."""
import hashlib

import pytest

from inflight.exercises.sharing import check_choose_victim, check_prefix_hit
from inflight.engine.prefix_cache import ROOT_KEY, block_key


def _stub(*args, **kwargs):
    raise NotImplementedError


# --- prefix hit -------------------------------------------------------------------------------------
def good_loop(tokens, bs, cached):
    keys, parent = [], ROOT_KEY
    for i in range(len(tokens) // bs):
        parent = block_key(parent, tokens[i * bs:(i + 1) * bs])
        keys.append(parent)
    hit = 0
    while hit < len(keys) and keys[hit] in cached:
        hit += 1
    return keys, min(hit * bs, (len(tokens) - 1) // bs * bs)


def good_early_stop(tokens, bs, cached):
    keys, parent, hit, missed = [], ROOT_KEY, 0, False
    full = len(tokens) - len(tokens) % bs
    for start in range(0, full, bs):
        parent = block_key(parent, tokens[start:start + bs])
        keys.append(parent)
        if not missed and parent in cached and start + bs <= len(tokens) - 1:
            hit += bs
        else:
            missed = True
    return keys, hit


@pytest.mark.parametrize("fn", [good_loop, good_early_stop])
def test_prefix_hit_accepts_correct(fn):
    r = check_prefix_hit(fn, quiet=True)
    assert r, r.report


def m_no_parent(tokens, bs, cached):  # every block keyed alone
    keys = [block_key(b"", tokens[i:i + bs]) for i in range(0, len(tokens) // bs * bs, bs)]
    hit = 0
    while hit < len(keys) and keys[hit] in cached:
        hit += 1
    return keys, min(hit, (len(tokens) - 1) // bs) * bs


def m_partial(tokens, bs, cached):  # the half-filled tail block gets a key too
    keys, parent = [], ROOT_KEY
    i = 0
    while i < len(tokens):
        parent = block_key(parent, tokens[i:i + bs])
        keys.append(parent)
        i += bs
    hit = 0
    while hit < len(keys) and keys[hit] in cached:
        hit += 1
    return keys, min(hit, (len(tokens) - 1) // bs) * bs


def m_all_cached(tokens, bs, cached):  # serves the whole prompt from the cache
    keys, parent = [], ROOT_KEY
    for i in range(len(tokens) // bs):
        parent = block_key(parent, tokens[i * bs:(i + 1) * bs])
        keys.append(parent)
    hit = 0
    for k in keys:
        if k not in cached:
            break
        hit += bs
    return keys, hit


def m_any_block(tokens, bs, cached):  # counts every cached block, gaps or not
    keys, parent = [], ROOT_KEY
    for i in range(len(tokens) // bs):
        parent = block_key(parent, tokens[i * bs:(i + 1) * bs])
        keys.append(parent)
    n = len([k for k in keys if k in cached])
    return keys, min(n, (len(tokens) - 1) // bs) * bs


def m_count_blocks(tokens, bs, cached):  # returns blocks, not tokens
    keys, parent = [], ROOT_KEY
    for i in range(len(tokens) // bs):
        parent = block_key(parent, tokens[i * bs:(i + 1) * bs])
        keys.append(parent)
    hit = 0
    while hit < len(keys) and keys[hit] in cached:
        hit += 1
    return keys, min(hit, (len(tokens) - 1) // bs)


def m_mid_block(tokens, bs, cached):  # keeps one token, but cuts a block in half
    keys, parent = [], ROOT_KEY
    for i in range(len(tokens) // bs):
        parent = block_key(parent, tokens[i * bs:(i + 1) * bs])
        keys.append(parent)
    hit = 0
    while hit < len(keys) and keys[hit] in cached:
        hit += 1
    return keys, min(hit * bs, len(tokens) - 1)


@pytest.mark.parametrize("fn,mistake", [
    (m_no_parent, "keying a block without its prefix"),
    (m_partial, "caching a partial block"),
    (m_all_cached, "forgetting to keep one token to recompute"),
    (m_any_block, "counting hits after a miss"),
    (m_count_blocks, "blocks instead of tokens"),
    (m_mid_block, "keeping one token but not whole blocks"),
])
def test_prefix_hit_rejects_mutants(fn, mistake):
    r = check_prefix_hit(fn, quiet=True)
    assert not r and r.mistake == mistake, r.report
    assert r.report.count("💡") == 1 and "🤔" not in r.report


def test_prefix_hit_rejects_a_different_hash_without_a_named_mistake():
    def own_hash(tokens, bs, cached):
        keys, parent = [], b""
        for i in range(len(tokens) // bs):
            parent = hashlib.md5(parent + bytes(tokens[i * bs:(i + 1) * bs])).digest()
            keys.append(parent)
        return keys, 0
    r = check_prefix_hit(own_hash, quiet=True)
    assert not r and "expected" in r.report


def test_prefix_hit_report_shows_the_token_count():
    # the count is often the only difference: the keys must not push it off the report's line
    r = check_prefix_hit(m_all_cached, quiet=True)
    assert not r and str(r.expected[1]) in r.report.splitlines()[2]
    assert len(r.report.splitlines()[2]) < 200


def test_prefix_hit_stub():
    assert check_prefix_hit(_stub, quiet=True).not_implemented


# --- preemption victim --------------------------------------------------------------------------------
def victim_sorted(running):
    order = sorted(range(len(running)), key=lambda i: (running[i][1], running[i][2], i))
    return running[order[-1]][0]


def victim_loop(running):
    best = None
    for i, (rid, prio, arr) in enumerate(running):
        if best is None or (prio, arr) >= (best[1], best[2]):
            best = (rid, prio, arr)
    return best[0]


@pytest.mark.parametrize("fn", [victim_sorted, victim_loop])
def test_choose_victim_accepts_correct(fn):
    r = check_choose_victim(fn, quiet=True)
    assert r, r.report


def v_earliest(running):
    worst = max(p for _, p, _ in running)
    cands = [(a, i, rid) for i, (rid, p, a) in enumerate(running) if p == worst]
    return min(cands, key=lambda c: (c[0], -c[1]))[2]


def v_highest(running):
    best = min(p for _, p, _ in running)
    return max(((a, i, rid) for i, (rid, p, a) in enumerate(running) if p == best))[2]


def v_latest_only(running):
    return sorted(running, key=lambda x: x[2])[-1][0]


def v_first_lowest(running):
    worst = max(p for _, p, _ in running)
    return next(rid for rid, p, _ in running if p == worst)


def v_last_in_list(running):
    return running[len(running) - 1][0]


def v_tie_to_first(running):  # right on priority and arrival; a full tie goes to the first listed
    best = None
    for rid, p, a in running:
        if best is None or (p, a) > best[:2]:
            best = (p, a, rid)
    return best[2]


def v_oldest(running):
    return sorted(running, key=lambda x: x[2])[0][0]


@pytest.mark.parametrize("fn,mistake", [
    (v_earliest, "earliest instead of latest arrival"),
    (v_highest, "highest instead of lowest priority"),
    (v_latest_only, "priority ignored"),
    (v_first_lowest, "arrival ignored"),
    (v_last_in_list, "the last one admitted"),
    (v_oldest, "the oldest request"),
    (v_tie_to_first, "a full tie goes to the first listed"),
])
def test_choose_victim_rejects_mutants(fn, mistake):
    r = check_choose_victim(fn, quiet=True)
    assert not r and r.mistake == mistake, r.report
    assert r.report.count("💡") == 1 and "🤔" not in r.report


def test_choose_victim_stub():
    assert check_choose_victim(_stub, quiet=True).not_implemented
