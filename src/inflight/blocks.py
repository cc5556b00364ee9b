"""Block arithmetic, shared by the model layer (attention metadata) and the engine (allocator,
scheduler, budget): how many fixed-size blocks a number of tokens fills. Torch-free, so that Part I's
simulator can use it too.
"""
from __future__ import annotations

from inflight.checks import integer

__all__ = ["blocks_needed"]


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens: ceil(num_tokens / block_size), 0 for 0 tokens.

    The engine asks this for every running request at every step, so plain non-negative ints take
    a fast path; anything else goes through the package's checks (and is refused if it isn't one)."""
    if not (type(num_tokens) is int and type(block_size) is int and num_tokens >= 0 and block_size >= 1):
        num_tokens = integer("num_tokens", num_tokens, minimum=0)
        block_size = integer("block_size", block_size, minimum=1)
    return -(-num_tokens // block_size)  # integer ceil, no float rounding
