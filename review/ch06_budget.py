"""Chapter 6: the budget arithmetic."""
from _harness import run

from inflight.engine.budget import Budget
from inflight.exercises.engine_budget import check_budget


def ceil_div(a, b):
    return -(-a // b)


def correct(state):
    bs = state.block_size
    new_blocks = 0
    for r in state.running:
        covers = r.num_computed_tokens + r.num_scheduled_tokens
        new_blocks += max(0, ceil_div(covers, bs) - r.num_blocks)
    blocks = state.num_free_blocks - new_blocks - state.watermark_blocks
    tokens = state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running)
    slots = state.max_batch_size - len(state.running)
    return Budget(blocks, tokens, slots)


def w1_scheduled_only(state):
    # blocks for this step's tokens counted from scratch: ignores what is computed and held
    new_blocks = sum(ceil_div(r.num_scheduled_tokens, state.block_size) for r in state.running)
    tokens = state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running)
    return Budget(state.num_free_blocks - new_blocks - state.watermark_blocks, tokens,
                  state.max_batch_size - len(state.running))


def w2_tokens_per_request(state):
    # token budget charged one per running request, even for prefill chunks
    new_blocks = sum(max(0, ceil_div(r.num_computed_tokens + r.num_scheduled_tokens, state.block_size) - r.num_blocks)
                     for r in state.running)
    return Budget(state.num_free_blocks - new_blocks - state.watermark_blocks,
                  state.max_batched_tokens - len(state.running), state.max_batch_size - len(state.running))


def w3_plus_one(state):
    # reserves room for "the next token" too: computed + scheduled + 1
    new_blocks = sum(max(0, ceil_div(r.num_computed_tokens + r.num_scheduled_tokens + 1, state.block_size) - r.num_blocks)
                     for r in state.running)
    tokens = state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running)
    return Budget(state.num_free_blocks - new_blocks - state.watermark_blocks, tokens,
                  state.max_batch_size - len(state.running))


ANSWERS = [
    ("correct", None, correct),
    ("w1", "new blocks = ceil(scheduled / b): ignores computed tokens and held blocks", w1_scheduled_only),
    ("w2", "tokens left = max_batched_tokens - len(running): a prefill chunk costs 1", w2_tokens_per_request),
    ("w3", "blocks for computed + scheduled + 1 tokens (off by one)", w3_plus_one),
]

if __name__ == "__main__":
    run("ch06bu", ANSWERS, check_budget)
