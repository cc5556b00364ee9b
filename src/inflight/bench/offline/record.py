"""What one run of one mode records (`RunRecord`), and the clock every run is measured on.

Every runner — ours in `runners`, transformers' in `peers` — hands requests out at their arrival
times (`Arrivals`) inside `timed_run`, which also times the model's forward passes and samples
peak memory, so that every mode is measured the same way.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from inflight.bench.profiling import ForwardTimer, GcPauses, PeakMemory, sync
from inflight.bench.offline.prompts import BenchRequest

__all__ = ["RunRecord", "Arrivals", "timed_run", "kv_bytes_per_token"]


@dataclass
class RunRecord:
    """What one mode did on one workload: tokens, per-request times (s since start), per-step facts."""

    mode: str
    tokens: dict[str, list[int]] = field(default_factory=dict)
    first_token: dict[str, float] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    wall: float = 0.0  # start -> last token
    idle: float = 0.0  # time spent waiting for requests to arrive (online workloads)
    forward_seconds: float | None = None
    forward_calls: int = 0
    forward_tokens: int = 0  # input tokens fed to the model's forward (prefill + decode, padding included)
    step_batch: list[int] = field(default_factory=list)  # sequences in each forward pass
    step_time: list[float] = field(default_factory=list)  # when each step ended (s since start)
    step_tokens: list[int] = field(default_factory=list)  # tokens each engine step fed the model (engine modes)
    step_sequences: list[int] = field(default_factory=list)  # sequences in each of those steps (engine modes)
    kv_used_tokens: list[int] = field(default_factory=list)  # tokens of unfinished requests in cache, per step
    kv_allocated_bytes: int | None = None
    kv_bytes_per_token: int | None = None
    peak_memory_bytes: int | None = None
    gc_pauses: dict[str, float] | None = None  # the garbage collector's passes inside the timed run (`GcPauses`)
    engine_stats: dict[str, Any] = field(default_factory=dict)
    step_stats: list[Any] = field(default_factory=list)  # the engine's own record of every step (engine modes)
    notes: list[str] = field(default_factory=list)

    def add_step(self, time_s: float, batch: int, kv_used_tokens: int) -> None:
        """One forward pass: when it ended, how many sequences it carried, the KV tokens they held."""
        self.step_time.append(time_s)
        self.step_batch.append(batch)
        self.kv_used_tokens.append(kv_used_tokens)


class Arrivals:
    """Hands out requests whose arrival time has passed, and sleeps until the next one when idle."""

    def __init__(self, requests: Sequence[BenchRequest], start: float):
        self.pending = deque(sorted(requests, key=lambda r: r.arrival))
        self.start = start
        self.idle = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start

    def arrived(self, limit: int | None = None) -> list[BenchRequest]:
        now, out = self.now(), []
        while self.pending and self.pending[0].arrival <= now and (limit is None or len(out) < limit):
            out.append(self.pending.popleft())
        return out

    def until_next(self) -> float | None:
        """Seconds until the next request arrives (<= 0: it has), None when none is left."""
        return self.pending[0].arrival - self.now() if self.pending else None

    def wait_next(self) -> None:
        delay = self.until_next()
        if delay is not None and delay > 0:
            time.sleep(delay)
            self.idle += delay

    def batches(self, size: int) -> Iterator[list[BenchRequest]]:
        """Static batching's intake: up to `size` arrived requests at a time (the next batch is taken
        when the caller asks for it, i.e. once the last one is done), sleeping while none has arrived."""
        while self.pending:
            batch = self.arrived(size)
            if batch:
                yield batch
            else:
                self.wait_next()

    def __bool__(self) -> bool:
        return bool(self.pending)


@contextmanager
def timed_run(rec: RunRecord, model: Any, requests: Sequence[BenchRequest]) -> Iterator[Arrivals]:
    """Start the clock, the forward-pass timer and the peak-memory sampler; yield the arrivals.
    On exit (after the device has finished its queued work) `rec` gets the wall and idle time and
    what the instruments saw."""
    with ForwardTimer(model) as ft, PeakMemory(model.device) as pm, GcPauses() as gp:
        arrivals = Arrivals(requests, time.perf_counter())
        yield arrivals
        sync(model.device)
        rec.wall = arrivals.now()
        rec.idle = arrivals.idle
    rec.forward_seconds, rec.forward_calls, rec.forward_tokens = ft.seconds, ft.calls, ft.tokens
    rec.peak_memory_bytes = pm.peak_bytes
    rec.gc_pauses = gp.as_dict()


def kv_bytes_per_token(model: Any) -> int:
    """KV-cache bytes one token of `model` takes (all layers, keys and values, in its dtype)."""
    from inflight.model.kv_cache import kv_bytes_per_token as per_token

    cfg = model.config
    return per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, model.dtype)
