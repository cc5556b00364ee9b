"""Chapter 8: prefix_hit(token_ids, block_size, cached_keys) -> (keys of full blocks, tokens served)."""
from _harness import run

from inflight.engine.prefix_cache import ROOT_KEY, block_key
from inflight.exercises.sharing import check_prefix_hit


def full_block_keys(token_ids, block_size):
    keys, parent = [], ROOT_KEY
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start:start + block_size])
        keys.append(parent)
    return keys


def correct(token_ids, block_size, cached_keys):
    keys = full_block_keys(token_ids, block_size)
    limit = (len(token_ids) - 1) // block_size if token_ids else 0
    hits = 0
    while hits < min(limit, len(keys)) and keys[hits] in cached_keys:
        hits += 1
    return keys, hits * block_size


def w1_cap_off_by_one(token_ids, block_size, cached_keys):
    # "a prompt of k blocks takes k-1": caps at len // b - 1 blocks, one too few when the prompt is not whole blocks
    keys = full_block_keys(token_ids, block_size)
    limit = max(0, len(token_ids) // block_size - 1)
    hits = 0
    while hits < min(limit, len(keys)) and keys[hits] in cached_keys:
        hits += 1
    return keys, hits * block_size


def w2_partial_block_key(token_ids, block_size, cached_keys):
    # keys every block, the partial last one too
    keys, parent = [], ROOT_KEY
    for start in range(0, len(token_ids), block_size):
        parent = block_key(parent, token_ids[start:start + block_size])
        keys.append(parent)
    limit = (len(token_ids) - 1) // block_size if token_ids else 0
    hits = 0
    while hits < limit and keys[hits] in cached_keys:
        hits += 1
    return keys, hits * block_size


def w3_blocks_not_tokens(token_ids, block_size, cached_keys):
    # returns the number of cached blocks instead of tokens
    keys, tokens = correct(token_ids, block_size, cached_keys)
    return keys, tokens // block_size


ANSWERS = [
    ("correct", None, correct),
    ("w1", "cap at len // b - 1 blocks: one block too few when the prompt ends mid-block", w1_cap_off_by_one),
    ("w2", "returns a key for the partial last block too", w2_partial_block_key),
    ("w3", "returns cached blocks, not cached tokens (units)", w3_blocks_not_tokens),
]

if __name__ == "__main__":
    run("ch08ph", ANSWERS, check_prefix_hit)
