"""Chapter 5: slot_mapping(block_table, positions, block_size)."""
from _harness import run

from inflight.exercises import paged as graders


def correct(block_table, positions, block_size):
    slots = []
    for p in positions:
        block, offset = divmod(p, block_size)
        slots.append(block_table[block] * block_size + offset)
    return slots


def w1_no_scale(block_table, positions, block_size):
    # forgets to scale the block id by the block size
    return [block_table[p // block_size] + p % block_size for p in positions]


def w2_swapped(block_table, positions, block_size):
    # division and modulo swapped
    return [block_table[p % block_size] * block_size + p // block_size for p in positions]


def w3_in_place(block_table, positions, block_size):
    # reuses the caller's positions list for the answer (mutates the input)
    for i, p in enumerate(positions):
        positions[i] = block_table[p // block_size] * block_size + p % block_size
    return positions


ANSWERS = [
    ("correct", None, correct),
    ("w1", "block_table[p // b] + p % b: block id not multiplied by block size", w1_no_scale),
    ("w2", "div and mod swapped: block_table[p % b] * b + p // b", w2_swapped),
    ("w3", "writes the slots into the caller's positions list (mutates input)", w3_in_place),
]

if __name__ == "__main__":
    run("ch05sm", ANSWERS, graders.check_slot_mapping)
