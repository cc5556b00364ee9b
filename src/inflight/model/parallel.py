"""Tensor parallelism (Megatron-LM), the layers: one linear layer's matrix split across N ranks.

A linear layer `y = x @ W.T` with `W [out, in]` splits two ways, and a transformer layer uses both,
in pairs, so that it talks only twice:

- **column-parallel** (`ColumnParallelLinear`): rank r holds the rows `[r·out/N, (r+1)·out/N)` of
  `W` — a slice of the *output* features. Every rank reads the whole `x` and computes its slice of
  `y`; no communication. q/k/v (split by attention heads) and gate/up (split by the MLP's columns).
- **row-parallel** (`RowParallelLinear`): rank r holds the columns `[r·in/N, (r+1)·in/N)` of `W` —
  a slice of the *input* features, exactly the slice of `x` the column-parallel layer before it
  produced. Each rank's product is a partial sum of the whole `y`; one **all-reduce** adds them up.
  o_proj and down_proj. A bias is added once (rank 0 holds it, the others hold zeros).

So attention splits by heads (each rank attends with its own heads, over the KV cache of its own KV
heads) and the MLP by intermediate columns, and each of the two ends in one all-reduce of a
`[tokens, hidden]` tensor: two per layer. Where the model has fewer KV heads than ranks
(`num_key_value_heads < N`, grouped-query attention), each KV head is *replicated* on the
`N / num_key_value_heads` ranks whose query heads read it, as vLLM does (`kv_heads_per_rank`).

The embedding and the LM head are **replicated** here, not split by vocabulary as vLLM's
`VocabParallelEmbedding` / `ParallelLMHead` are. Why: the sampler lives in one place (the driver)
and needs whole rows of logits, which a vocabulary split would have to all-gather; the book's tiny
model has a prime vocabulary (257) that splits evenly in no way but with padding; and the cost is
small and computed in chapter 10: for a 70B-class model (vocabulary 128,256, hidden 8,192, bf16) the
two matrices are 4.2 GB per device replicated against 0.5 GB split 8 ways, some 3.7 GB of each 80 GB
card that could have held KV. Only rank 0 runs the LM head (the others' rows would be thrown away).

vLLM's counterparts: `vllm/model_executor/layers/linear.py` (`ColumnParallelLinear`,
`QKVParallelLinear`, `MergedColumnParallelLinear`, `RowParallelLinear`),
`vocab_parallel_embedding.py`, and `vllm/distributed/parallel_state.py` (the groups).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from inflight.model.tp_layout import check_tp_size, head_range, kv_head_range, kv_heads_per_rank

__all__ = ["TPGroup", "ColumnParallelLinear", "RowParallelLinear", "kv_heads_per_rank", "kv_head_range",
           "head_range", "column_shard", "row_shard", "check_tp_size"]


@dataclass
class TPGroup:
    """This rank's place in its tensor-parallel group, and the all-reduce it uses.

    `group` is a `torch.distributed` process group (None for a group of one, or to run the sums in
    a test without processes). `comm_seconds` adds up the time spent inside all-reduces — on a CPU
    with gloo the call returns when the sum is done, so it is the communication time *plus* the time
    spent waiting for the slowest rank to arrive; on CUDA (NCCL, asynchronous) it is only measured
    when `time_comm=True`, which synchronises the device around each call."""

    rank: int = 0
    size: int = 1
    group: Any = None
    time_comm: bool = True
    comm_seconds: float = field(default=0.0, compare=False)
    num_all_reduces: int = field(default=0, compare=False)
    bytes_all_reduced: int = field(default=0, compare=False)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place (every rank ends with the same total)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        cuda = x.is_cuda and self.time_comm
        if cuda:
            torch.cuda.synchronize(x.device)
        t0 = time.perf_counter()
        dist.all_reduce(x, group=self.group)
        if cuda:
            torch.cuda.synchronize(x.device)
        self.comm_seconds += time.perf_counter() - t0
        self.num_all_reduces += 1
        self.bytes_all_reduced += x.numel() * x.element_size()
        return x

    def take_counters(self) -> tuple[float, int, int]:
        """(seconds, all-reduces, bytes) since the last call, and start counting again."""
        out = (self.comm_seconds, self.num_all_reduces, self.bytes_all_reduced)
        self.comm_seconds, self.num_all_reduces, self.bytes_all_reduced = 0.0, 0, 0
        return out


def column_shard(w: Any, rank: int, tp_size: int) -> Any:
    """Rank `rank`'s rows of `w [out, ...]` (a weight or a bias): column parallelism, the output split."""
    per = w.shape[0] // tp_size
    return w[rank * per:(rank + 1) * per]


def row_shard(w: Any, rank: int, tp_size: int) -> Any:
    """Rank `rank`'s columns of `w [out, in]`: row parallelism, the input split."""
    per = w.shape[1] // tp_size
    return w[:, rank * per:(rank + 1) * per]


class ColumnParallelLinear(nn.Linear):
    """This rank's slice of the output features of `in_features -> out_features` (see the module
    docstring). Its forward is an ordinary linear layer: no communication. `out_features` is the
    local width (for the fused q|k|v: this rank's heads' q, then k, then v)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup):
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp


class RowParallelLinear(nn.Linear):
    """This rank's slice of the input features; `reduce(y)` all-reduces its partial result into the
    whole output (the serving path calls the matmul itself, then `reduce`). `in_features` is the
    local width."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup):
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp

    def reduce(self, y: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(super().forward(x))
