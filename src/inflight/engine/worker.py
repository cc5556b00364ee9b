"""One tensor-parallel worker process: its shard of the model, the KV cache of its heads, and a loop
that runs whatever the driver sends (vLLM's `vllm/v1/worker/gpu_worker.py` with the busy loop of
`WorkerProc` in `vllm/v1/executor/multiproc_executor.py`).

The driver (`inflight.engine.executor.MultiprocExecutor`) starts N of these with
`torch.multiprocessing` (spawn). Each joins one `torch.distributed` group — gloo on CPU, NCCL on
CUDA, rendezvous through the driver's `TCPStore` on 127.0.0.1, sockets on the loopback interface
only — loads only its slices of the checkpoint (`inflight.model.sharding.load_shard`), and then
serves messages from its pipe, one at a time, each answered on the same pipe:

- `("num_blocks", block_size, max_batch_size, max_model_len)` → how many KV blocks fit this device;
- `("init_cache", num_blocks, block_size)`, `("init_swap", num_cpu_blocks)` → allocate;
- `("step", step_id, ops, plan)` → first the block copies the scheduler ordered for this step
  (`ops`: swap-out, swap-in, copy-on-write, in the order it made them), then the forward pass of
  `plan` (`inflight.engine.model_runner.StepPlan`); rank 0 answers with the rows of logits, every
  rank with its timings;
- `("shutdown",)` → leave the group and exit.

A worker ignores Ctrl-C (the driver decides when it ends) and exits by itself when its pipe closes
(the driver died) or when a collective fails (a peer died: gloo and NCCL raise after the group's
timeout at the latest); any error is sent to the driver, with its traceback, before it exits.
"""
from __future__ import annotations

import os
import signal
import time
import traceback
from datetime import timedelta
from typing import Any

__all__ = ["worker_main", "WorkerConfig"]


class WorkerConfig(dict):
    """What a worker is started with (a plain dict, so that it pickles under spawn): path, rank,
    world_size, device_type, dtype, store_port, timeout, threads."""


def _device(device_type: str, rank: int):
    import torch

    if device_type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def worker_main(cfg: dict, conn: Any) -> None:
    """The process's whole life (the target `MultiprocExecutor` spawns)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the driver handles it
    rank = cfg["rank"]
    loopback = _loopback_interface()  # sockets on loopback only (gloo and NCCL pick an interface themselves otherwise)
    if loopback is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(cfg["threads"])
        device = _device(cfg["device_type"], rank)
        store = dist.TCPStore("127.0.0.1", cfg["store_port"], cfg["world_size"] + 1, is_master=False,
                              timeout=timedelta(seconds=cfg["timeout"]))
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=cfg["world_size"],
                                timeout=timedelta(seconds=cfg["timeout"]),
                                **({"device_id": device} if device.type == "cuda" else {}))
        worker = Worker(cfg, device, dist.group.WORLD)
        conn.send(("ready", worker.info()))
    except BaseException:  # noqa: BLE001 - reported to the driver, which raises it
        _report(conn, rank)
        return
    try:
        worker.serve(conn)
    except (EOFError, OSError):  # the driver is gone: nothing to tell
        pass
    except BaseException:  # noqa: BLE001
        _report(conn, rank)
    finally:
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group cannot always be left cleanly; the process ends anyway
            pass


def _loopback_interface() -> str | None:
    """The loopback interface's name: `lo` on Linux, `lo0` on macOS (None if there is none to name)."""
    import socket

    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in names if n.startswith("lo")), None)


def _report(conn: Any, rank: int) -> None:
    try:
        conn.send(("error", rank, traceback.format_exc()))
    except (OSError, EOFError, BrokenPipeError):
        pass


class Worker:
    """A rank's model shard and KV cache, and the handlers of the driver's messages."""

    def __init__(self, cfg: dict, device: Any, group: Any):
        import torch

        from inflight.model.parallel import TPGroup
        from inflight.model.sharding import load_shard

        self.rank, self.device = cfg["rank"], device
        self.tp = TPGroup(self.rank, cfg["world_size"], group)
        dtype = getattr(torch, cfg["dtype"]) if cfg["dtype"] else None
        self.model = load_shard(cfg["path"], self.tp, device=device, dtype=dtype)
        self.kv_cache = None
        self.swapper = None
        self.fail_at_step = cfg.get("fail_at_step")  # tests: raise inside this step (a worker that breaks)

    def info(self) -> dict:
        m = self.model
        return {"rank": self.rank, "pid": os.getpid(), "device": str(self.device),
                "weight_bytes": sum(p.numel() * p.element_size() for p in m.parameters()),
                "num_attention_heads": m.config.num_attention_heads, "num_key_value_heads": m.config.num_key_value_heads,
                "intermediate_size": m.config.intermediate_size, "dtype": str(m.dtype).removeprefix("torch.")}

    def serve(self, conn: Any) -> None:
        while True:
            msg = conn.recv()
            kind = msg[0]
            if kind == "shutdown":
                return
            handler = getattr(self, f"_on_{kind}")
            conn.send(handler(*msg[1:]))

    def _on_num_blocks(self, block_size: int, max_batch_size: int, max_model_len: int):
        from inflight.engine.model_runner import default_num_blocks

        return ("num_blocks", default_num_blocks(self.model.config, self.model.dtype, self.device, block_size,
                                                 max_batch_size, max_model_len))

    def _on_init_cache(self, num_blocks: int, block_size: int):
        from inflight.engine.gc_heap import freeze_gc_heap
        from inflight.model.kv_cache import KVCache

        self.kv_cache = KVCache.for_model(self.model.config, num_blocks, block_size, self.model.dtype, self.device)
        freeze_gc_heap()  # the shard and its cache are here to stay: out of the collector's full passes (`gc_heap`)
        return ("cache", self.kv_cache.nbytes, self.kv_cache.bytes_per_block)

    def _on_init_swap(self, num_cpu_blocks: int):
        from inflight.engine.model_runner import KVSwapper

        self.swapper = KVSwapper(self.kv_cache, num_cpu_blocks)
        return ("swap", num_cpu_blocks)

    def _on_step(self, step_id: int, ops: list, plan: Any):
        import torch

        from inflight.engine.model_runner import step_tensors

        t0 = time.perf_counter()
        for kind, pairs in ops:  # the scheduler's copies, in its order, before the forward pass reads the cache
            if kind == "copy":
                self.kv_cache.copy_blocks(pairs)
            elif kind == "swap_out":
                self.swapper.swap_out(pairs)
            else:
                self.swapper.swap_in(pairs)
        logits = None
        self.tp.take_counters()
        if plan is not None:
            if self.fail_at_step is not None and step_id >= self.fail_at_step:
                raise RuntimeError(f"rank {self.rank}: failing at step {step_id} as asked (fail_at_step)")
            with torch.inference_mode():
                ids, meta, idx = step_tensors(plan, self.kv_cache.block_size, self.device)
                out = self.model(ids, meta.positions, meta, self.kv_cache, logits_indices=idx)
            if out is not None:
                logits = out.cpu().numpy()  # (rank 0 only: by value through the pipe)
            elif self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        comm, n_reduce, nbytes = self.tp.take_counters()
        return ("out", step_id, logits, {"rank": self.rank, "seconds": time.perf_counter() - t0,
                                         "comm_seconds": comm, "all_reduces": n_reduce, "bytes_all_reduced": nbytes})
