"""Chapter 5: blocks_needed(num_tokens, block_size)."""
import numpy as np
from _harness import run

from inflight.exercises import paged as graders


def correct(num_tokens, block_size):
    full, rest = divmod(num_tokens, block_size)
    return full + (1 if rest else 0)


def w1_plus_one(num_tokens, block_size):
    # always one more block than the full ones: wrong at every exact multiple (and 0 -> 1)
    return num_tokens // block_size + 1


def w2_np_ceil(num_tokens, block_size):
    # numpy rounding up: right value, but a numpy float
    return np.ceil(num_tokens / block_size)


def w3_at_least_one(num_tokens, block_size):
    # "a sequence always owns a block": 0 tokens -> 1 block
    return max(1, (num_tokens + block_size - 1) // block_size)


ANSWERS = [
    ("correct", None, correct),
    ("w1", "n // b + 1: one block too many at exact multiples and for 0 tokens", w1_plus_one),
    ("w2", "np.ceil(n / b): returns a numpy float64", w2_np_ceil),
    ("w3", "max(1, ceil): 0 tokens -> 1 block", w3_at_least_one),
]

if __name__ == "__main__":
    run("ch05bn", ANSWERS, graders.check_blocks_needed)
