"""Tensor parallelism, the driver's stand-ins for what lives on the workers: the KV cache and the
swapper the scheduler calls (they only *queue* block copies for the workers' next step), and the
model runner that plans a step here, runs it there (`MultiprocExecutor.execute`) and samples here."""
from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from inflight.engine.model_runner import ModelRunner, StepTimes as RunnerTimes, plan_batch
from inflight.engine.scheduler_types import SchedulerOutput

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.executor import MultiprocExecutor, WorkerStepTimes

__all__ = ["ParallelKVCache", "ParallelSwapper", "ParallelModelRunner"]


class ParallelKVCache:
    """The driver's view of the workers' KV caches: the pool's shape for the scheduler, and
    `copy_blocks` (copy-on-write), which queues the copy for every worker's next step."""

    def __init__(self, executor: "MultiprocExecutor", num_blocks: int, block_size: int, bytes_per_block: int):
        self.executor = executor
        self.num_blocks, self.block_size = num_blocks, block_size
        self.device, self.dtype = executor.device, executor.dtype
        self.bytes_per_block = bytes_per_block  # per device (its heads only)
        self.num_layers = executor.config.num_hidden_layers

    def __getattr__(self, name: str) -> Any:  # (only for what this stand-in does not have: say why)
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"the KV cache lives in the tensor-parallel workers: its {name!r} is not here "
                             "(prefill/decode disaggregation is not supported with tensor_parallel_size > 1)")

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    @property
    def nbytes(self) -> int:
        return self.bytes_per_block * self.num_blocks

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self.executor.pending_ops.append(("copy", list(pairs)))


class ParallelSwapper:
    """Swap preemption's copies, queued for every worker's next step (each moves its own heads
    between its device cache and its CPU pool). `bytes_moved` counts all devices together."""

    def __init__(self, executor: MultiprocExecutor, kv: ParallelKVCache):
        self.executor, self.kv = executor, kv
        self.bytes_moved = 0

    def _queue(self, kind: str, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self.executor.pending_ops.append((kind, list(pairs)))
            self.bytes_moved += len(pairs) * self.kv.bytes_per_block * self.executor.tensor_parallel_size

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        self._queue("swap_out", pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        self._queue("swap_in", pairs)


class ParallelModelRunner(ModelRunner):
    """`ModelRunner` whose forward pass runs on the workers: the batch is planned here
    (`plan_batch`), executed there, and sampled here from rank 0's logits (`ModelRunner._sample`)."""

    def __init__(self, executor: MultiprocExecutor, kv_cache: ParallelKVCache, sampler: Any):
        self.executor, self.kv_cache, self.sampler = executor, kv_cache, sampler
        self.model, self.graphs, self.threads = executor, None, None
        self.device = torch.device("cpu")  # where the logits arrive
        self.history: deque[WorkerStepTimes] = deque(maxlen=10_000)  # the workers' view of the last steps

    def run(self, batch: SchedulerOutput):
        t0 = time.perf_counter()
        plan, seqs, prompt_requests, n_prompt = plan_batch(batch)
        t1 = time.perf_counter()
        logits, times = self.executor.execute(plan)
        t2 = time.perf_counter()
        times.round_trip, times.num_tokens = t2 - t1, len(plan.input_ids)
        times.decode_only = all(q == 1 for q in plan.query_lens)
        self.history.append(times)
        tokens, failures, lps = self._sample(logits, seqs, prompt_requests, n_prompt)
        return tokens, failures, RunnerTimes(prepare=t1 - t0, forward=t2 - t1, sample=time.perf_counter() - t2), lps

    def run_isolating(self, batch: SchedulerOutput):
        """No isolating: a failure on a worker ends the engine (`WorkerError`)."""
        return (batch, *self.run(batch), {})
