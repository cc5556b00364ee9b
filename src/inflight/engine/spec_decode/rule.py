"""The accept/reject rule in plain Python, one request at a time: chapter 12's exercise.

`verify(p, q, draft, accept_u, draw_u)` is `rejection_sampler.rejection_sample` written over lists,
with its random numbers given up front: `accept_u[i]` decides proposal `i`, `draw_u` draws the last
token. Fed the same numbers, the two return the same tokens (tests/test_spec_decode.py checks it);
the engine runs the torch one, which works on the model's logits without copying them into lists.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["draw", "verify"]


def draw(weights: Sequence[float], u: float) -> int:
    """Inverse-CDF draw from non-negative `weights` (need not sum to 1) with a uniform `u` in [0, 1):
    the first index whose running sum exceeds `u` times the total (zero weights are never drawn)."""
    total = sum(weights)
    target, acc, last = u * total, 0.0, None
    for i, w in enumerate(weights):
        if w > 0:
            acc += w
            last = i
            if acc > target:
                return i
    if last is None:
        raise ValueError("draw: every weight is zero")
    return last  # (u * total rounded up to the total itself)


def verify(p: Sequence[Sequence[float]], q: Sequence[Sequence[float]], draft: Sequence[int],
           accept_u: Sequence[float], draw_u: float) -> list[int]:
    """The tokens one verifying step emits: `p[i]` is the target's distribution after the first `i`
    proposals (`len(draft) + 1` rows), `q[i]` the proposer's, from which `draft[i]` was drawn. Accept
    `draft[i]` when `accept_u[i] < min(1, p[i][x] / q[i][x])`; at the first rejection emit a token
    drawn from the residual max(0, p[i] - q[i]) and stop; if all are accepted, a bonus token from p[k]."""
    for i, x in enumerate(draft):
        if accept_u[i] < min(1.0, p[i][x] / q[i][x]):
            continue
        residual = [max(0.0, a - b) for a, b in zip(p[i], q[i])]
        return list(draft[:i]) + [draw(residual, draw_u)]
    return list(draft) + [draw(p[len(draft)], draw_u)]
