"""Small measuring tools for "where does the time go": section timers, a model-forward timer,
peak-memory tracking, the device's matmul and memory-bandwidth limits, and profiler summaries.

Everything here works on CPU and CUDA; on CUDA the timers synchronise so a time belongs to the
section that launched the work (which slightly slows an asynchronous pipeline — a measurement cost).
"""
from __future__ import annotations

import contextlib
import cProfile
import gc
import io
import os
import pstats
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterator, Sequence

import torch

from inflight.model import skinny_gemm

__all__ = ["SectionTimer", "ForwardTimer", "PeakMemory", "rss_bytes", "measure_matmul_flops",
           "measure_memory_bandwidth", "model_flops_per_token", "cprofile_summary", "torch_profile_summary",
           "profile_ops", "quiet_native_stderr", "sync"]


def sync(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work so wall-clock times are real (a no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class SectionTimer:
    """Accumulates wall time per named section: `with t.section("prep"): ...`; `t.totals` in seconds."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = device
        self.totals: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        sync(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            sync(self.device)
            self.totals[name] += time.perf_counter() - start
            self.counts[name] += 1

    def shares(self) -> dict[str, float]:
        """Each section's fraction of the timed total."""
        total = sum(self.totals.values())
        return {k: v / total for k, v in self.totals.items()} if total else {}


class ForwardTimer:
    """Times every call of `model.forward` (wrapped on the instance, restored on exit), so a benchmark
    can split a run into "inside the model" and "everything else" (scheduling, input prep, sampling)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.seconds = 0.0
        self.calls = 0
        self.tokens = 0  # input tokens fed to forward (prefill + decode)
        self._orig: Any = None

    def __enter__(self) -> "ForwardTimer":
        orig = self.model.forward  # a bound method; instance attribute shadows the class method
        device = getattr(self.model, "device", None)

        def timed(*args: Any, **kwargs: Any) -> Any:
            sync(device)
            start = time.perf_counter()
            out = orig(*args, **kwargs)
            sync(device)
            self.seconds += time.perf_counter() - start
            self.calls += 1
            ids = args[0] if args else kwargs.get("input_ids")
            if isinstance(ids, torch.Tensor):
                self.tokens += ids.numel()
            return out

        self._orig = self.model.__dict__.get("forward")
        self.model.forward = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._orig is None:
            del self.model.forward
        else:
            self.model.forward = self._orig


def rss_bytes() -> int:
    """Resident memory of this process now (bytes)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakMemory:
    """Peak memory used while the block runs, above what was in use when it started.

    CUDA: `torch.cuda.max_memory_allocated` (exact). CPU: resident memory sampled every
    `interval` seconds by a thread (so a spike shorter than that can be missed). Each sample wakes
    the thread and takes the GIL from the run being measured: every 5 ms that cost the paged engine
    a few percent of its speed on two cores, every 20 ms it is lost in the noise."""

    def __init__(self, device: torch.device | str = "cpu", interval: float = 0.02):
        self.device = torch.device(device)
        self.interval = interval
        self.peak_bytes = 0
        self.start_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
        else:
            self.start_bytes = rss_bytes()
            self._peak = self.start_bytes
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, rss_bytes())

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self.start_bytes
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
            self.peak_bytes = max(self._peak, rss_bytes()) - self.start_bytes


class GcPauses:
    """The garbage collector's passes while the block runs: how many, and the seconds they stopped
    the process for, in all and for the full ones (the oldest generation, which walk every object the
    collector tracks; `inflight.engine.gc_heap`)."""

    def __init__(self):
        self.passes = self.full_passes = 0
        self.seconds = self.full_seconds = 0.0
        self._t0: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            dt, self._t0 = time.perf_counter() - self._t0, None
            self.passes += 1
            self.seconds += dt
            if info.get("generation") == 2:
                self.full_passes += 1
                self.full_seconds += dt

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self._callback)

    def as_dict(self) -> dict[str, float]:
        return {"passes": self.passes, "seconds": self.seconds, "full_passes": self.full_passes,
                "full_seconds": self.full_seconds}


def _best_time(fn: Callable[[], Any], device: torch.device, repeats: int, min_seconds: float) -> float:
    fn()  # warm up (allocations, kernel selection)
    sync(device)
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        dt = time.perf_counter() - start
        best, spent = min(best, dt), spent + dt
        if spent > min_seconds and _ >= 2:
            break
    return best


def measure_matmul_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                         n: int | None = None, repeats: int = 10, min_seconds: float = 0.5) -> float:
    """Best measured matmul rate (FLOP/s) of an n×n by n×n product: the device's practical compute roof.
    On a CPU in float32 the package's own GEMM (`skinny_gemm`, weights packed once) is timed on the
    same product beside torch's, and the faster counts: where the kernel is built for AVX-512 and the
    BLAS torch ships runs 8-wide code (the book's AMD CPU), torch's rate is not the machine's roof, and
    a floor built on it would not be a floor for the kernels that run faster."""
    device = torch.device(device)
    n = n or (4096 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = _best_time(lambda: a @ b, device, repeats, min_seconds)
    if device.type == "cpu" and dtype == torch.float32 and n <= skinny_gemm.max_rows() and skinny_gemm.load() is not None:
        with torch.inference_mode():
            t = min(t, _best_time(lambda: skinny_gemm.kernel_linear(a, b), device, repeats, min_seconds))
    return 2 * n**3 / t


def measure_linear_layers(model: torch.nn.Module, batch: int, repeats: int = 10, min_seconds: float = 0.2,
                          layers: Sequence[torch.nn.Linear] | None = None) -> float:
    """Seconds one step of `batch` tokens spends in the model's own linear layers alone (every
    `nn.Linear`, at its real shape, one after another; or only `layers`): the step time if attention,
    norms and every other operator were free. Small layers multiply far below the n×n roof, so this — not
    `measure_matmul_flops` — is the ceiling a model this shape can reach at this batch. Where the
    skinny-GEMM kernel takes this many rows, both it and torch are timed and the faster counts, so
    the figure stays a floor whichever one the caches favour."""
    linears = list(layers) if layers is not None else [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears or batch < 1:
        raise ValueError(f"need a model with linear layers and batch >= 1 (got {len(linears)} layers, batch {batch})")
    p = next(model.parameters())
    xs = [torch.randn(batch, m.in_features, device=p.device, dtype=p.dtype) for m in linears]
    impls = [lambda x, m: torch.nn.functional.linear(x, m.weight, m.bias)]
    if p.device.type == "cpu" and p.dtype == torch.float32 and skinny_gemm.load() is not None and \
            batch <= skinny_gemm.max_rows():
        impls.append(lambda x, m: skinny_gemm.kernel_linear(x, m.weight, m.bias))

    with torch.inference_mode():
        return min(_best_time(lambda: [fn(x, m) for m, x in zip(linears, xs)], p.device, repeats, min_seconds)
                   for fn in impls)


def measure_memory_bandwidth(device: torch.device | str = "cpu", nbytes: int | None = None, repeats: int = 10,
                             min_seconds: float = 0.5) -> float:
    """Best measured copy rate (bytes read + written per second) of a buffer much larger than the caches."""
    device = torch.device(device)
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 1 << 27)
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    t = _best_time(lambda: dst.copy_(src), device, repeats, min_seconds)
    return 2 * nbytes / t


def model_flops_per_token(config: Any, context_len: float = 0.0) -> float:
    """Forward FLOPs for one token: 2 per weight of every matmul the token passes through (LM head
    included, embedding lookup excluded), plus attention's QK^T and PV over `context_len` keys."""
    h, layers = config.hidden_size, config.num_hidden_layers
    d = config.head_dim or h // config.num_attention_heads
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size
    matmul = layers * per_layer + h * config.vocab_size
    attention = layers * 2 * q * context_len  # QK^T and PV: 2 FLOPs × heads·head_dim × keys, twice
    return 2.0 * matmul + 2.0 * attention


def cprofile_summary(fn: Callable[[], Any], top: int = 15, sort: str = "tottime") -> tuple[Any, str]:
    """Run `fn` under cProfile; return its result and a text table of the `top` functions by `sort`."""
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(sort).print_stats(top)
    return result, buf.getvalue()


def torch_profile_summary(fn: Callable[[], Any], top: int = 15, device: torch.device | str = "cpu") -> tuple[Any, str]:
    """Run `fn` under torch.profiler; return its result and a table of the `top` ops by self time."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        result = fn()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return result, prof.key_averages().table(sort_by=key, row_limit=top)


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for the block: the profiler's C++ side logs start/stop lines there,
    which would otherwise land on the reader's page (Python's own `sys.stderr` is left alone)."""
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (some embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_ops(fn: Callable[[], Any], repeats: int = 5,
                device: torch.device | str = "cpu") -> list[tuple[str, float, int]]:
    """Profile `repeats` calls of `fn` (after one warm-up call) with torch.profiler and return every
    op's (name, self seconds per call of `fn`, op calls per call of `fn`), largest self time first.
    Self time counts only the op's own work, not the ops it calls, so the rows add up to the total:
    CPU time on a CPU, the time of the kernels each op launched on CUDA (not checked on a GPU yet)."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    sync(device)
    with quiet_native_stderr(), profile(activities=acts) as prof:
        for _ in range(repeats):
            fn()
        sync(device)
    rows = []
    for e in prof.key_averages():
        if cuda:
            # device time of the ops (aten::*); the kernels' own rows would count the same time twice
            if not e.key.startswith("aten::"):
                continue
            us = getattr(e, "self_device_time_total", None)
            us = e.self_cuda_time_total if us is None else us
        else:
            us = e.self_cpu_time_total
        if us > 0:
            rows.append((e.key, us / 1e6 / repeats, e.count // repeats))
    return sorted(rows, key=lambda r: -r[1])

