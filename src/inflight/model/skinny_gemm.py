"""Linear layers for a decode step's few rows: one per running sequence.

A matrix multiply with up to a few dozen rows is bound by reading the weights, and in a serving step
they come from memory: the step's attention has just streamed the KV cache through the CPU's caches.
The BLAS torch calls is built for large products; at this shape the C kernel in `csrc/skinny_gemm.c`,
which reads each weight once and keeps the sums in registers, is faster. vLLM has the same idea for
its GPUs ("skinny GEMMs" for small batches).

Every output of the kernel is one fixed sum, whatever else is in the batch. More than `MAX_ROWS`
rows stay with torch, whose blocked GEMM is the faster there. Anything else — another dtype or device, a gradient, no
compiler, `INFLIGHT_CPU_KERNEL=0`, `fused_ops.reference_only()` — runs `torch.nn.functional.linear`.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from inflight.model import c_build, fused_ops, thread_pool

__all__ = ["linear", "kernel_linear", "load", "build_error", "MAX_ROWS"]

SOURCE = Path(__file__).with_name("csrc") / "skinny_gemm.c"
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=gnu99"]
SYMBOLS = ("inflight_skinny_gemm_f32", "inflight_use_pool", "inflight_parallel_backend")
PROFILER_NAME = "inflight::skinny_gemm_c"
#: the most rows the kernel takes. `python -m inflight.bench.kernels.cpu` times all of the tiny
#: model's linear layers for one step, the weights out of cache as in a serving step; on the book's
#: 2-core CPU (`results/cpu_kernel_cpu.json`) against MKL: even at 1 row, 1.3-1.8x faster at 2-32
#: rows, 1.1x at 48-64, slower from 96.
MAX_ROWS = 64


def _declare(lib: ctypes.CDLL) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.inflight_skinny_gemm_f32.argtypes = [p, i64, i64, p, i64, p, p, ctypes.c_int]
    lib.inflight_skinny_gemm_f32.restype = None
    thread_pool.attach(lib)


_library = c_build.LazyLibrary(SOURCE, FLAGS, SYMBOLS, _declare)


def load() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use, cached per machine by `c_build`), or None."""
    return _library.load()


def build_error() -> str | None:
    """Why `load()` returned None (None if it hasn't been tried or it worked)."""
    return _library.build_error()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x `[M, K]` and weight `[N, K]`, through the C kernel when
    1 <= M <= MAX_ROWS and it can run here."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or weight.dim() != 2 or \
            x.shape[1] != weight.shape[1] or (bias is not None and bias.shape != (weight.shape[0],)):
        return F.linear(x, weight, bias)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    lib = load() if fused_ops.runs_in_c(*tensors) else None
    return F.linear(x, weight, bias) if lib is None else _run(lib, x, weight, bias)


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The C kernel itself, at any number of rows (`bench.kernels.cpu` measures where it stops paying):
    contiguous float32 CPU tensors x `[M, K]`, weight `[N, K]`, bias `[N]` or None."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"the skinny-GEMM kernel is unavailable: {build_error()}")
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or \
            (bias is not None and bias.shape != (weight.shape[0],)) or \
            any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        raise ValueError(f"the kernel takes contiguous float32 CPU tensors x [M, K], weight [N, K], bias [N]; got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}, {None if bias is None else tuple(bias.shape)}")
    return _run(lib, x, weight, bias)


def _run(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The call itself, on tensors already checked (by `linear` on the serving path, once)."""
    (M, K), N = x.shape, weight.shape[0]
    out = x.new_empty(M, N)
    args = (x.data_ptr(), M, K, weight.data_ptr(), N, None if bias is None else bias.data_ptr(), out.data_ptr(),
            thread_pool.threads())
    c_build.profiled_call(PROFILER_NAME, lib.inflight_skinny_gemm_f32, *args)
    return out
