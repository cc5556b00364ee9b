"""Summary statistics shared by the simulator, the benchmark and the chapters (torch-free)."""
from __future__ import annotations

import math
from typing import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default; NaN when empty."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
