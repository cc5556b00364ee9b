"""Tensor parallelism, the processes: one driver with the scheduler, N workers with the model
(vLLM's `vllm/v1/executor/multiproc_executor.py`, at nano-vllm's scale).

    engine = LLMEngine.from_pretrained(path, tensor_parallel_size=2)

The driver is the process that made the engine: it keeps the one scheduler, the block tables and
the sampler, and runs no model. `MultiprocExecutor` starts N workers (`inflight.engine.worker`)
with `torch.multiprocessing` (spawn), each holding 1/N of every layer and the KV cache of its heads.
Per step the driver sends each worker the same message — the batch as plain lists
(`StepPlan`) and the KV-block copies the scheduler ordered while it planned (copy-on-write of
shared blocks, swap-out and swap-in of preempted requests: `ParallelKVCache` and `ParallelSwapper`
only *record* them; every worker makes them on its own heads before the forward pass). The workers
run the forward pass together — two all-reduces per layer among themselves — and rank 0 sends back
the logits of the rows to sample; the driver samples them (so the random streams of seeded
requests, parallel sampling and log-probabilities are the single-device engine's, unchanged).
vLLM samples in the worker and sends token ids back, which saves moving `rows × vocab` floats
per step; at this book's scale the simplicity wins, and the chapter says what it costs.

The driver never takes part in a collective, so it can always tell what went wrong: it waits for
every reply with a deadline (`timeout`; the workers' collective timeout is twice that), and watches each
worker's process handle meanwhile. A worker that dies or raises ends the engine at once with its
error; one that hangs ends it when the deadline passes; either way the others are stopped and every
later call raises the same `WorkerError`. `shutdown()` — called by `LLMEngine.shutdown()`, by
garbage collection (`weakref.finalize`) and at interpreter exit — asks the workers to leave, then
terminates and finally kills any that did not, and joins them all: no process is left behind.
"""
from __future__ import annotations

import sys
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inflight.engine.interrupts import sigint_deferred
from inflight.engine.parallel_runner import ParallelKVCache, ParallelModelRunner, ParallelSwapper

__all__ = ["MultiprocExecutor", "TensorParallelEngine", "parallel_executor", "engine_from_pretrained", "ParallelModelRunner", "ParallelKVCache", "ParallelSwapper",
           "WorkerError", "DEFAULT_TIMEOUT_S"]

#: Seconds the driver waits for a step's replies (and the workers' collective timeout).
DEFAULT_TIMEOUT_S = 60.0
#: The workers' collective timeout, as a multiple of the driver's: longer, so that when one rank
#: hangs, the driver (which knows who is silent) says so before the others' all-reduces give up.
COLLECTIVE_TIMEOUT_FACTOR = 2.0
#: Seconds the driver waits for the workers to start and load their shards.
STARTUP_TIMEOUT_S = 300.0
#: Memory one CPU worker needs beyond its weights — a Python process with torch imported: 245 MB
#: resident measured (160 MB of it its own, the rest torch's libraries) — for the check that the
#: machine can start N of them.
WORKER_BASE_BYTES = 256 << 20


class WorkerError(RuntimeError):
    """A tensor-parallel worker died, raised, or did not answer in time: the engine cannot go on."""


@dataclass
class WorkerStepTimes:
    """One step as the workers saw it: the slowest rank's wall time, and per rank the time inside
    all-reduces (communication plus waiting for the slowest rank)."""

    seconds: float = 0.0
    comm_seconds: list[float] = field(default_factory=list)
    all_reduces: int = 0
    bytes_all_reduced: int = 0
    round_trip: float = 0.0   # the driver's wait: sending the step, the workers' time, the logits back
    num_tokens: int = 0       # tokens the step computed
    decode_only: bool = False


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_startable(n: int, device_type: str, weight_bytes: int) -> None:
    """Refuse (ValueError) more ranks than this machine can start: on CUDA one GPU each; on a CPU,
    N processes each with torch and its shard must fit the memory available."""
    if device_type == "cuda":
        have = torch.cuda.device_count()
        if n > have:
            raise ValueError(f"tensor_parallel_size {n} needs {n} CUDA devices, this machine has {have}")
        return
    avail = _available_memory()
    need = n * WORKER_BASE_BYTES + weight_bytes
    if avail is not None and need > avail:
        raise ValueError(f"tensor_parallel_size {n}: {n} worker processes need about {need / 2**30:.1f} GiB "
                         f"(torch in each, plus the weights), this machine has {avail / 2**30:.1f} GiB available")


@contextmanager
def _main_module_hidden():
    """While a worker is spawned: a worker needs only `inflight.engine.worker`, never the user's
    script, so spawn is not told about `__main__` — no `if __name__ == "__main__":` guard needed,
    and a script read from stdin (which spawn could not re-read) works too."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _stop(procs: list, conns: list, grace: float = 5.0) -> None:
    """Ask every worker to leave; terminate, then kill, whoever is still there; join them all."""
    for c in conns:
        try:
            c.send(("shutdown",))
        except (OSError, EOFError, BrokenPipeError, ValueError):
            pass
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(2.0)
        if p.is_alive():
            p.kill()
            p.join(2.0)
    for c in conns:
        try:
            c.close()
        except OSError:
            pass


class MultiprocExecutor:
    """The driver's side of N tensor-parallel workers (see the module docstring). It stands in for
    the model in `LLMEngine`: `config` (the whole model's), `device`, `dtype`."""

    def __init__(self, path: str | Path, tensor_parallel_size: int, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 startup_timeout: float = STARTUP_TIMEOUT_S, threads: int | None = None,
                 _worker_options: dict | None = None):
        import torch.distributed as dist
        import torch.multiprocessing as tmp

        from inflight import checks
        from inflight.device import pick_device
        from inflight.model.loading import _resolve, load_config
        from inflight.model.sharding import check_config_tp

        folder = _resolve(path)  # (not a folder, not a checkpoint: a clear error before anything starts)
        self.config = load_config(folder)
        self.tensor_parallel_size = n = check_config_tp(self.config, tensor_parallel_size)
        self.timeout = checks.number("timeout", timeout, minimum=0.1)
        self.device = torch.device(pick_device(None if device is None else str(device)))
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"tensor parallelism runs on cpu (gloo) or cuda (NCCL), not {self.device.type}")
        from inflight.model.loading import _default_dtype
        import json
        raw = json.loads((folder / "config.json").read_text())
        self.dtype = dtype or _default_dtype(self.device, raw.get("torch_dtype") or raw.get("dtype"))
        c = self.config
        approx_params = c.vocab_size * c.hidden_size * 2 + c.num_hidden_layers * (
            c.hidden_size * c.head_dim * (c.num_attention_heads * 2 + c.num_key_value_heads * 2)
            + 3 * c.hidden_size * c.intermediate_size)
        check_startable(n, self.device.type, approx_params * torch.empty((), dtype=self.dtype).element_size())
        self.name_or_path = str(path)
        if threads is None:
            from inflight.threads import usable_cores
            threads = max(1, usable_cores() // n)
        self.dead: str | None = None
        self._step_id = 0
        self.pending_ops: list[tuple[str, list[tuple[int, int]]]] = []  # copies the next step carries
        # the rendezvous: a store this process serves on loopback, on a port the system picks
        self._store = dist.TCPStore("127.0.0.1", 0, n + 1, is_master=True, wait_for_workers=False)
        ctx = tmp.get_context("spawn")
        from inflight.engine.worker import worker_main
        self._procs, self._conns = [], []
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        try:
            for rank in range(n):
                parent, child = ctx.Pipe()
                cfg = {"path": str(folder), "rank": rank, "world_size": n, "device_type": self.device.type,
                       "dtype": str(self.dtype).removeprefix("torch."), "store_port": self._store.port,
                       "timeout": self.timeout * COLLECTIVE_TIMEOUT_FACTOR, "threads": threads, **(_worker_options or {}).get(rank, {})}
                p = ctx.Process(target=worker_main, args=(cfg, child), name=f"inflight-tp-worker-{rank}", daemon=True)
                with _main_module_hidden():
                    p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            self.workers = self._collect("ready", startup_timeout, "to start and load its shard")
        except BaseException:
            self.shutdown()
            raise

    # -- talking to the workers ------------------------------------------------------------------
    def _broadcast(self, msg: tuple) -> None:
        if self.dead is not None:
            raise WorkerError(self.dead)
        with sigint_deferred():  # (a step sent to some ranks only would leave them alone in an all-reduce)
            self._send_all(msg)

    def _send_all(self, msg: tuple) -> None:
        for rank, c in enumerate(self._conns):
            try:
                c.send(msg)
            except (OSError, BrokenPipeError, EOFError):
                self._fail(f"tensor-parallel worker rank {rank} is gone (its pipe is closed; exit code "
                           f"{self._procs[rank].exitcode})")

    def _collect(self, kind: str, timeout: float, doing: str = "to answer", step_id: int | None = None) -> list:
        """One reply of `kind` from every rank, in rank order; a death, an error or the deadline
        ends the engine (`WorkerError`)."""
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < len(self._conns):
            waiting = [r for r in range(len(self._conns)) if r not in replies]
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"tensor-parallel worker rank(s) {waiting} gave no answer within {timeout:g} s "
                           f"(waiting for them {doing}): hung, or far too slow; the engine is stopped")
            wait([self._conns[r] for r in waiting] + [self._procs[r].sentinel for r in waiting], timeout=left)
            for rank in waiting:
                conn, proc = self._conns[rank], self._procs[rank]
                if conn.poll(0):  # (a message first: a worker that failed wrote why before it exited)
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        proc.join(1.0)
                        self._fail(f"tensor-parallel worker rank {rank} (pid {proc.pid}) died "
                                   f"(exit code {proc.exitcode})")
                    if msg[0] == "error":
                        self._fail(self._errors_report(msg, [r for r in waiting if r != rank]))
                    if step_id is not None and msg[0] == "out" and msg[1] != step_id:
                        continue  # the answer to a step the driver stopped waiting for (Ctrl-C)
                    if msg[0] != kind:
                        self._fail(f"tensor-parallel worker rank {rank} answered {msg[0]!r} to {kind!r}")
                    replies[rank] = msg
                elif not proc.is_alive():
                    proc.join(1.0)
                    self._fail(f"tensor-parallel worker rank {rank} (pid {proc.pid}) died (exit code {proc.exitcode})")
        return [replies[r] for r in range(len(self._conns))]

    def _errors_report(self, first: tuple, others: list[int]) -> str:
        """Why the engine stops: the first error and those other ranks post within 0.5 s, the cause first (a rank
        that raised leaves its peers failing in the all-reduce it never joined; theirs can come first)."""
        errors, grace = [first], time.monotonic() + 0.5
        for r in others:
            try:
                msg = self._conns[r].recv() if self._conns[r].poll(max(0.0, grace - time.monotonic())) else ("",)
            except (EOFError, OSError):
                continue
            errors += [msg] if msg[0] == "error" else []
        follow = ("gloo", "nccl", "connection closed", "connection reset", "broken pipe", "timed out")
        errors.sort(key=lambda m: any(w in m[2].lower() for w in follow))  # (stable: first come stays first)
        silent = [r for r in others if r not in {m[1] for m in errors}]
        also = f" (rank(s) {silent} had not answered: hung or dead?)" if silent else ""
        return "\n".join(f"tensor-parallel worker rank {m[1]} failed{also if i == 0 else ''}:\n{m[2].rstrip()}"
                         for i, m in enumerate(errors))

    def _fail(self, why: str) -> None:
        self.dead = why
        self.shutdown()
        raise WorkerError(why)

    # -- what the engine asks --------------------------------------------------------------------
    def determine_num_blocks(self, block_size: int, max_batch_size: int, max_model_len: int) -> int:
        """The KV pool each device holds by default (the smallest over the ranks)."""
        self._broadcast(("num_blocks", block_size, max_batch_size, max_model_len))
        return min(m[1] for m in self._collect("num_blocks", self.timeout))

    def init_cache(self, num_blocks: int, block_size: int) -> ParallelKVCache:
        self._broadcast(("init_cache", num_blocks, block_size))
        replies = self._collect("cache", self.timeout, "to allocate its KV cache")
        return ParallelKVCache(self, num_blocks, block_size, bytes_per_block=replies[0][2])

    def init_swap(self, num_cpu_blocks: int, kv: ParallelKVCache) -> ParallelSwapper:
        self._broadcast(("init_swap", num_cpu_blocks))
        self._collect("swap", self.timeout, "to allocate its CPU swap pool")
        return ParallelSwapper(self, kv)

    def execute(self, plan: Any) -> tuple[torch.Tensor | None, WorkerStepTimes]:
        """One step on every worker: the pending block copies, then the forward pass of `plan`;
        returns rank 0's logits (float32, on the CPU) and the step's timings."""
        ops, self.pending_ops = self.pending_ops, []
        self._step_id += 1
        self._broadcast(("step", self._step_id, ops, plan))
        replies = self._collect("out", self.timeout, "to run a step", step_id=self._step_id)
        logits = replies[0][2]
        times = [r[3] for r in replies]
        st = WorkerStepTimes(seconds=max(t["seconds"] for t in times), comm_seconds=[t["comm_seconds"] for t in times],
                       all_reduces=times[0]["all_reduces"], bytes_all_reduced=times[0]["bytes_all_reduced"])
        return (None if logits is None else torch.from_numpy(np.asarray(logits))), st

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def is_alive(self) -> bool:
        return self.dead is None and bool(self._procs) and all(p.is_alive() for p in self._procs)

    def shutdown(self) -> None:
        """Stop every worker (idempotent)."""
        if self.dead is None:
            self.dead = "the engine was shut down"
        self._finalizer()

    def __call__(self, *args, **kwargs):  # (LLMEngine checks that its model is callable)
        raise TypeError("a MultiprocExecutor runs steps through LLMEngine, not by being called")


def parallel_executor(model: Any, kv_connector: Any = None) -> MultiprocExecutor | None:
    """`model` when it is a `MultiprocExecutor` (the engine is tensor-parallel), else None; refuses
    what a tensor-parallel engine does not do: shipping KV to another engine (disaggregation)."""
    if not isinstance(model, MultiprocExecutor):
        return None
    if kv_connector is not None:
        raise ValueError("kv_connector (prefill/decode disaggregation) is not supported with tensor_parallel_size > 1: "
                         "the KV cache lives in the worker processes, split by heads")
    return model


class TensorParallelEngine:
    """What `LLMEngine` has for tensor parallelism (its base class): `from_pretrained` with
    `tensor_parallel_size`, the size, and `shutdown`. `executor` is the engine's
    `MultiprocExecutor`, or None when this process runs the model."""

    executor: MultiprocExecutor | None = None

    @property
    def tensor_parallel_size(self) -> int:
        """How many devices the model is split over (1: this process runs it)."""
        return 1 if self.executor is None else self.executor.tensor_parallel_size

    @classmethod
    def from_pretrained(cls, path: Any, *, tensor_parallel_size: int = 1, device: Any = None, dtype: Any = None,
                        distributed_timeout: float = DEFAULT_TIMEOUT_S, **engine_args: Any) -> Any:
        """An engine over the checkpoint folder (or hub id) `path`, with its tokenizer if it has one
        (`tokenizer=` overrides). `tensor_parallel_size=N > 1` splits the model over N worker
        processes (gloo on CPU, NCCL on CUDA, one GPU each), each with its shard and the KV cache of
        its heads; `distributed_timeout` bounds how long a step may take before a silent worker ends
        the engine. Call `shutdown()` when done (garbage collection and interpreter exit do it too)."""
        return engine_from_pretrained(cls, path, tensor_parallel_size, device, dtype, distributed_timeout, engine_args)

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent); the engine cannot step afterwards."""
        if self.executor is not None:
            self.executor.shutdown()


def engine_from_pretrained(cls: type, path: Any, tensor_parallel_size: int, device: Any, dtype: Any,
                           timeout: float, engine_args: dict) -> Any:
    """`LLMEngine.from_pretrained` (see there): the checkpoint and the TP size checked first, the
    tokenizer found, then one process, or a `MultiprocExecutor` (stopped again if the engine refuses
    its arguments)."""
    from inflight.model.loading import _resolve, load_config, load_pretrained, load_tokenizer
    from inflight.model.sharding import check_config_tp

    folder = _resolve(path)
    check_config_tp(load_config(folder), tensor_parallel_size)
    if "tokenizer" not in engine_args:
        try:
            engine_args["tokenizer"] = load_tokenizer(folder)
        except FileNotFoundError:
            engine_args["tokenizer"] = None
    if tensor_parallel_size == 1:
        return cls(load_pretrained(folder, device=device, dtype=dtype), **engine_args)
    executor = MultiprocExecutor(folder, tensor_parallel_size, device=device, dtype=dtype, timeout=timeout)
    try:
        return cls(executor, **engine_args)
    except BaseException:
        executor.shutdown()
        raise
