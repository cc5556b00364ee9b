"""CUDA graphs for decode steps (vLLM's `CUDAGraphRunner`, nano-vllm's `capture_cudagraph`).

A decode step of a small model is hundreds of tiny kernels (30 layers × a dozen operations for a
SmolLM2-135M shape), each a few microseconds of GPU work behind ~5-10 µs of Python and launch
overhead: the GPU waits on the CPU. A CUDA graph records the whole forward pass once and replays
it with one launch. The price is that a replay repeats *exactly* what was recorded: the same
kernels, on the same memory, with the same shapes. So:

* the inputs live in **static buffers** that every step overwrites (token ids, positions, slots,
  context lengths, block tables — attention metadata of fixed shape: one row of `max_blocks`
  entries per sequence, enough for `max_model_len` tokens), and the logits land in a static buffer;
* one graph per **batch-size bucket** (1, 2, 4, 8, ..., up to `max_batch_size`, at most
  `MAX_CAPTURE_SIZE`): a batch of 5 runs in the graph of 8, its 3 extra rows are **dummies** that
  read and write one scratch block of the cache that no request ever owns (context 1, position 0),
  and their logits are dropped;
* nothing in the captured forward may wait for the GPU (no `.item()`, no data-dependent shapes):
  the Triton decode kernel plans its grid from the block table's *width*, never its contents.

Only decode-only steps take this path (prefill chunks vary in length; they run eagerly). On a CPU
there is nothing to capture, but the same padded-bucket path runs eagerly (`capture=False`), which
is how the tests check that padding changes no token.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence as Seq

import torch

from inflight.engine.sequence import Sequence
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache

__all__ = ["DecodeGraphRunner", "batch_buckets", "wants_cuda_graphs", "MAX_CAPTURE_SIZE"]

#: The largest batch captured (vLLM's default is 512): larger decode batches run eagerly, where
#: launch overhead is a small share of the step anyway.
MAX_CAPTURE_SIZE = 512


def wants_cuda_graphs(device: torch.device, enforce_eager: bool) -> bool:
    """Whether an engine on `device` captures decode graphs: on CUDA, unless `enforce_eager`."""
    return device.type == "cuda" and not enforce_eager


def batch_buckets(max_batch_size: int) -> list[int]:
    """Batch sizes to capture: powers of two up to `max_batch_size` (capped at `MAX_CAPTURE_SIZE`),
    and that limit itself, so that every batch up to it has a bucket."""
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
    top = min(max_batch_size, MAX_CAPTURE_SIZE)
    sizes = [1 << k for k in range(top.bit_length()) if 1 << k <= top]
    return sizes if sizes[-1] == top else sizes + [top]


class DecodeGraphRunner:
    """Runs decode-only batches padded to a bucket, from static buffers, by graph replay on CUDA
    (`capture=True`) or eagerly (`capture=False`: the same buffers and padding, for CPUs and tests).

    `scratch_block` is a block of `kv_cache` that the block allocator never hands out: the dummy
    rows write their keys and values there."""

    def __init__(self, model: Any, kv_cache: KVCache, *, max_batch_size: int, max_model_len: int,
                 scratch_block: int, capture: bool):
        if not 0 <= scratch_block < kv_cache.num_blocks:
            raise ValueError(f"scratch_block {scratch_block} is not a block of the cache (0..{kv_cache.num_blocks - 1})")
        self.model, self.kv_cache = model, kv_cache
        self.sizes = batch_buckets(max_batch_size)
        self.block_size = kv_cache.block_size
        self.max_blocks = -(-max_model_len // self.block_size)
        self.scratch_block = scratch_block
        n, dev = self.sizes[-1], kv_cache.device
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), scratch_block * self.block_size, dtype=torch.long, device=dev)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.block_tables = torch.full((n, self.max_blocks), scratch_block, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(n, model.config.vocab_size, dtype=torch.float32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.capture_error: str | None = None
        if capture:
            self.capture()

    # --- which batches -------------------------------------------------------------------------
    def bucket(self, n: int) -> int | None:
        """The smallest captured size that holds `n` rows (None: too big, run eagerly unpadded)."""
        return next((b for b in self.sizes if b >= n), None)

    def can_run(self, seqs: Seq[Sequence]) -> bool:
        """A decode-only batch that fits a bucket: every sequence computes exactly its last token."""
        return (0 < len(seqs) <= self.sizes[-1]
                and all(s.num_scheduled_tokens == 1 and s.num_computed_tokens + 1 == s.num_tokens
                        and len(s.block_table) <= self.max_blocks for s in seqs))

    # --- one step --------------------------------------------------------------------------------
    def prepare(self, seqs: Seq[Sequence]) -> tuple[int, int]:
        """Write the batch into the static buffers, padded with dummy rows to its bucket; returns the
        bucket and the longest context (which only the eager path reads)."""
        n, bs, scratch = len(seqs), self.block_size, self.scratch_block
        b = self.bucket(n)
        ids, pos, slots = [0] * b, [0] * b, [scratch * bs] * b
        ctx = [1] * b
        width = max(len(s.block_table) for s in seqs)
        tables = [[scratch] * width for _ in range(b)]
        for i, s in enumerate(seqs):
            p = s.num_computed_tokens
            ids[i], pos[i], ctx[i] = s.token_ids[p], p, p + 1
            slots[i] = s.block_table[p // bs] * bs + p % bs
            tables[i][:len(s.block_table)] = s.block_table
        # entries right of `width` keep older block ids: they lie past every context and are never read
        self.input_ids[:b].copy_(torch.tensor(ids), non_blocking=True)
        self.positions[:b].copy_(torch.tensor(pos), non_blocking=True)
        self.slot_mapping[:b].copy_(torch.tensor(slots), non_blocking=True)
        self.context_lens[:b].copy_(torch.tensor(ctx, dtype=torch.int32), non_blocking=True)
        self.block_tables[:b, :width].copy_(torch.tensor(tables, dtype=torch.int32), non_blocking=True)
        return b, max(ctx)

    def forward(self, n: int, b: int, max_context: int) -> torch.Tensor:
        """The logits `[n, vocab]` of the first `n` rows of the prepared bucket `b` (a view of the
        static buffer: valid until the next step)."""
        graph = self.graphs.get(b)
        if graph is not None:
            graph.replay()
        else:
            self._run_model(b, max_context)
        return self.logits[:n]

    def _metadata(self, b: int, max_context: int) -> AttentionMetadata:
        """Attention metadata over the static buffers' first `b` rows (built fresh for each eager
        step: its derived indices are cached on the object, and the buffers' contents change)."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:b + 1], context_lens=self.context_lens[:b],
            block_tables=self.block_tables[:b], slot_mapping=self.slot_mapping[:b], positions=self.positions[:b],
            max_query_len=1, max_context_len=max_context, is_decode=True, block_size=self.block_size,
            query_lens=[1] * b, context_lens_list=[max_context] * b)

    def _run_model(self, b: int, max_context: int) -> None:
        meta = self._metadata(b, max_context)
        self.logits[:b].copy_(self.model(self.input_ids[:b], self.positions[:b], meta, self.kv_cache))

    # --- capture ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Record one graph per bucket, largest first, sharing one memory pool (a smaller graph's
        intermediates fit in what the larger one reserved). A failure (e.g. an attention path that
        syncs) leaves no graph and a warning: the engine then runs every step eagerly."""
        full = self.max_blocks * self.block_size  # the captured kernels read context lengths from the buffer
        pool = torch.cuda.graph_pool_handle()
        try:
            for b in reversed(self.sizes):
                self._run_model(b, full)  # warm-up: Triton compiles, lazy state settles, outside the graph
                torch.cuda.synchronize(self.kv_cache.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._run_model(b, full)
                self.graphs[b] = graph
        except Exception as exc:
            self.graphs.clear()
            self.capture_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"CUDA graph capture failed ({self.capture_error[:300]}); decode steps run eagerly",
                          RuntimeWarning, stacklevel=2)
        torch.cuda.synchronize(self.kv_cache.device)
