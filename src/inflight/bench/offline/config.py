"""What a benchmark run is asked to do (`BenchConfig`), and what every mode is given (`BenchSetup`).

The modes, by number (the CLI's `--modes 1,4` and the chapter's table use these):

1. `sequential`   — our model, one request at a time (also the reference for correctness),
2. `static`       — our model, batches of B, each batch runs until its longest request ends,
3. `contiguous`   — our engine, continuous batching, B slots of maximum length,
4. `paged`        — our engine, continuous batching over a paged cache of the same KV memory,
5. `hf_static`    — transformers `generate` on left-padded static batches of B,
   `hf_continuous`— transformers' own continuous batching.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["MODES", "MODE_TITLES", "BenchConfig", "quick_config", "BenchSetup"]

MODES = ["sequential", "static", "contiguous", "paged", "hf_static", "hf_continuous"]
MODE_TITLES = {
    "sequential": "1 sequential (ours)",
    "static": "2 static batching (ours)",
    "contiguous": "3 continuous, contiguous KV",
    "paged": "4 continuous, paged KV",
    "hf_static": "5a transformers generate",
    "hf_continuous": "5b transformers CB",
}


@dataclass
class BenchConfig:
    n: int = 256
    batch_size: int = 64
    seed: int = 0
    modes: list[str] = field(default_factory=lambda: list(MODES))
    workloads: list[str] = field(default_factory=lambda: ["long_tailed", "uniform", "online"])
    output_mean: float = 48
    output_cap: int = 256
    prompt_range: tuple[int, int] = (16, 128)
    rate_fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0])
    online_n: int = 96
    online_modes: list[str] = field(default_factory=lambda: ["static", "paged"])
    paged_block_size: int = 16
    max_batched_tokens: int | None = None
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    attention_bench: bool = True
    prefix_bench: bool = True
    quick: bool = False
    threads: int | None = None
    decode_step_bench: bool = True
    logprob_tolerance: float | None = None  # half precision: the nats part; None: `agreement.TOLERANCE`
    # the comparison with the transformers peers (`bench.protocol.fair`): each in its own process at its best
    # setting, alternating; 0 rounds: none (the in-process table alone, which is no comparison); five
    # rounds for a committed claim, each paged run with its own floor (`fair_floor`)
    fair_rounds: int = 5
    fair_search_rounds: int = 1
    fair_search_n: int = 64
    fair_floor: bool = True
    fair_reference: str | None = None  # where the reference tokens are saved (None: a temporary file)


def quick_config(**overrides: Any) -> BenchConfig:
    """The CI smoke test: a few dozen short requests, every mode, one online rate — under a minute."""
    cfg = BenchConfig(n=24, batch_size=8, output_mean=12, output_cap=48, prompt_range=(8, 32),
                      rate_fractions=[1.0], online_n=16, workloads=["long_tailed", "online"], quick=True,
                      fair_rounds=1, fair_search_rounds=0, fair_floor=False)
    return replace(cfg, **overrides)  # an unknown name is a TypeError, not a silent new attribute


@dataclass
class BenchSetup:
    """Everything a mode needs besides the workload."""

    model: Any
    batch_size: int
    max_len: int  # longest prompt + output any request of any workload may reach
    paged_block_size: int = 16
    hf: Any = None
    hf_error: str | None = None
    max_batched_tokens: int | None = None
    agreement: dict = field(default_factory=dict)  # `agreement.policy_for`: exact tokens, or logprobs within a tolerance

    @property
    def kv_tokens(self) -> int:
        """The KV memory every cached mode gets, in tokens: B slots of maximum length."""
        return self.batch_size * self.max_len

    @property
    def paged_num_blocks(self) -> int:
        return self.kv_tokens // self.paged_block_size

    @property
    def paged_max_batch(self) -> int:
        # "as many requests as the same memory holds": never fewer seqs than blocks allow one block each
        return self.paged_num_blocks
