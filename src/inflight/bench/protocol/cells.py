"""The workload matrix: one benchmark is one shape of work, so the claim is measured on twelve.

A serving engine tuned on one workload can be slow beside it. The matrix crosses the three things
that move an engine's costs around:

- **the prompt-to-output ratio**: decode-heavy (one prompt token per two to three generated: the
  step is many single-token rows reading the KV cache), balanced (one to one or a little more),
  prefill-heavy (about ten to one: most of the work is prompt tokens, attention over long causal
  blocks);
- **the context length**: short (contexts up to ~200 tokens) and long (up to the tiny model's 512
  positions): how much KV each decode row reads and how long each prompt's causal attention is;
- **the batch limit** B: 16 and 64 slots of KV memory (static batching's batch, the paged engine's
  memory of B slots of the longest request).

Output lengths are long-tailed (a capped exponential, as the benchmark's own): it is the spread of
lengths inside a static batch that the work-bound ideal measures, so every cell has one. Each cell
has twice B requests (static batching runs two batches, continuous batching refills), fewer at B
64 for the long decode-heavy and balanced cells, whose peer would otherwise take most of a minute
a round (the matrix runs five rounds of twelve cells on two cores).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Cell", "SHAPES", "CELLS", "BENCHMARK", "ALL", "cell", "cell_names"]


@dataclass(frozen=True)
class Cell:
    """One workload of the matrix: its shape (ratio and context) at one batch limit."""

    ratio: str           # "decode-heavy" | "balanced" | "prefill-heavy"
    context: str         # "short" | "long"
    batch_size: int
    num_requests: int
    prompt_range: tuple[int, int]
    output_mean: float
    output_cap: int

    @property
    def name(self) -> str:
        return f"{self.ratio}/{self.context}/B{self.batch_size}"

    def shape(self) -> dict[str, Any]:
        """The keyword arguments `side_by_side` / `contender` take for this workload."""
        return {"prompt_range": self.prompt_range, "output_mean": self.output_mean, "output_cap": self.output_cap}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"name": self.name}


#: (ratio, context) -> prompt range, output mean, output cap. Means of the capped exponential land a
#: little under `output_mean` (the cap cuts the tail). The long cells stay within 512 positions.
SHAPES: dict[tuple[str, str], tuple[tuple[int, int], float, int]] = {
    ("decode-heavy", "short"): ((8, 32), 64, 160),
    ("balanced", "short"): ((32, 96), 56, 128),
    ("prefill-heavy", "short"): ((96, 192), 12, 48),
    ("decode-heavy", "long"): ((32, 96), 128, 320),
    ("balanced", "long"): ((96, 256), 128, 192),
    ("prefill-heavy", "long"): ((256, 448), 32, 64),
}

#: requests per cell: two static batches, except where a long decode-heavy cell would cost the peer minutes
_REQUESTS = {16: 32, 64: 128}
_LONG_REQUESTS = {("decode-heavy", "long"): {16: 32, 64: 64}, ("balanced", "long"): {16: 32, 64: 96}}


def _cells() -> list[Cell]:
    out = []
    for (ratio, context), (prompts, mean, cap) in SHAPES.items():
        for b in (16, 64):
            n = _LONG_REQUESTS.get((ratio, context), _REQUESTS)[b]
            out.append(Cell(ratio, context, b, n, prompts, mean, cap))
    return out


#: the benchmark's own workload (`python -m inflight.bench`: 256 long-tailed requests, prompts 16-128,
#: outputs mean 48 capped at 256, B 64), measured beside the matrix so its headline ratio is re-measured
#: by the same run; not one of the twelve
BENCHMARK = Cell("benchmark", "long-tailed", 64, 256, (16, 128), 48, 256)

CELLS: list[Cell] = _cells()
ALL: list[Cell] = CELLS + [BENCHMARK]


def cell_names() -> list[str]:
    return [c.name for c in ALL]


def cell(name: str) -> Cell:
    """The cell called `name` ("balanced/short/B16", or the benchmark's "benchmark/long-tailed/B64")."""
    for c in ALL:
        if c.name == name:
            return c
    raise ValueError(f"unknown cell {name!r}; the matrix has {cell_names()}")
