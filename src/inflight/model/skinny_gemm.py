"""Linear layers for a decode step's few rows: one per running sequence.

A matrix multiply with up to a few dozen rows is bound by reading the weights, and in a serving step
they come from memory: the step's attention has just streamed the KV cache through the CPU's caches.
The BLAS torch calls is built for large products and packs the weights again at every call; at this
shape the C kernel in `csrc/skinny_gemm.c`, which multiplies by weights packed once (`panels`: 16
output columns at a time, k-major) with a 6 x 16 tile of the output in registers, is faster. vLLM
has the same idea for its GPUs ("skinny GEMMs" for small batches).

Every output of the kernel is one fixed chain of multiply-adds, whatever else is in the batch. Built for a CPU
with AVX-512 its tile is 16 floats wide (the same bits, twice the arithmetic per instruction). At either width it
takes every step of up to 2048 rows, prefill chunks included (see MAX_ROWS): one kernel for every row count is what
keeps a row's result independent of its batch, and where the BLAS is faster on a large chunk it is faster by little.
Anything else — another dtype or device, a gradient, no compiler, `INFLIGHT_CPU_KERNEL=0`,
`fused_ops.reference_only()` — runs `torch.nn.functional.linear`.
"""
from __future__ import annotations

import ctypes
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

from inflight.model import c_build, fused_ops, thread_pool

__all__ = ["linear", "kernel_linear", "pack", "panels", "load", "build_error", "max_rows", "lanes", "MAX_ROWS"]

SOURCE = Path(__file__).with_name("csrc") / "skinny_gemm.c"
# -ffp-contract=off: every multiply-add is written out (csrc/vec8.h's fma8), none left to the compiler
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=gnu99", "-ffp-contract=off"]
SYMBOLS = ("inflight_packed_gemm_f32", "inflight_gemm_lanes", "inflight_use_pool", "inflight_parallel_backend")
PANEL = 16  # output columns per packed panel (csrc/skinny_gemm.c)
PROFILER_NAME = "inflight::skinny_gemm_c"
#: the most rows a step's linear layers send to the kernel (more go to torch's BLAS; the bound keeps a
#: step's scratch finite). `python -m inflight.bench.kernels.cpu` times all of the tiny model's linear
#: layers for one step, the weights out of cache as in a serving step, against torch's BLAS:
#: - built 16 wide, on an AMD EPYC whose BLAS runs 8-wide code (`results/cpu_kernel_cpu.json`): the
#:   kernel is 1.4-2.2x the BLAS at every size, 1-2048 rows; on an Intel Xeon whose BLAS runs AVX-512
#:   (`results/cpu_kernel_xeon_cpu.json`): 1.0-1.3x at 16-256 rows, 4-16 % slower at 384-2048;
#: - built 8 wide, on an AMD EPYC without AVX-512 (`results/cpu_kernel_zen3_cpu.json`): 1.1-2.1x at
#:   1-256 rows, and at 384-2048 from 8 % faster to 7 % slower. Until then 8-wide builds sent more than
#:   256 rows to the BLAS, so a prompt token's bits depended on whether its step held more than 256 rows,
#:   and a prefill step ran op by op instead of in the layer driver's one C call.
MAX_ROWS = 2048


def _declare(lib: ctypes.CDLL) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.inflight_packed_gemm_f32.argtypes = [p, i64, i64, p, i64, p, p, ctypes.c_int]
    lib.inflight_packed_gemm_f32.restype = None
    lib.inflight_gemm_lanes.argtypes = []
    lib.inflight_gemm_lanes.restype = ctypes.c_int
    thread_pool.attach(lib)


_library = c_build.LazyLibrary(SOURCE, FLAGS, SYMBOLS, _declare)


def load() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use, cached per machine by `c_build`), or None."""
    return _library.load()


def build_error() -> str | None:
    """Why `load()` returned None (None if it hasn't been tried or it worked)."""
    return _library.build_error()


def lanes() -> int | None:
    """Floats per vector in the compiled kernel's tile: 16 (AVX-512) or 8; None where it can't be built."""
    lib = load()
    return None if lib is None else int(lib.inflight_gemm_lanes())


def max_rows() -> int:
    """The most rows a step's linear layers send to the kernel (more go to torch): `MAX_ROWS`, at
    either vector width. (A function, so that a test can move the bound.)"""
    return MAX_ROWS


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x `[M, K]` and weight `[N, K]`, through the C kernel when
    1 <= M <= max_rows() and it can run here."""
    if x.dim() != 2 or x.shape[0] < 1 or weight.dim() != 2 or \
            x.shape[1] != weight.shape[1] or (bias is not None and bias.shape != (weight.shape[0],)):
        return F.linear(x, weight, bias)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    lib = load() if fused_ops.runs_in_c(*tensors) else None  # (a GPU tensor never builds the library)
    if lib is None or x.shape[0] > max_rows():
        return F.linear(x, weight, bias)
    return _run(lib, x, weight, bias)


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
    args = (x.data_ptr(), M, K, panels(weight).data_ptr(), N, None if bias is None else bias.data_ptr(),
            out.data_ptr(), thread_pool.threads())
    c_build.profiled_call(PROFILER_NAME, lib.inflight_packed_gemm_f32, *args)
    return out


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight [N, K]` as the kernel reads it: panels of 16 output columns, k-major,
    `[ceil(N / 16), K, 16]`, zeros past column N."""
    n, k = weight.shape
    padded = weight.detach().new_zeros((n + PANEL - 1) // PANEL * PANEL, k)
    padded[:n] = weight.detach()
    return padded.view(-1, PANEL, k).transpose(1, 2).contiguous()


#: id(weight) -> (a weak reference to it, its storage and version when packed, the panels)
_packed: dict[int, tuple[weakref.ref, tuple[int, int], torch.Tensor]] = {}


def _version(weight: torch.Tensor) -> int:
    try:
        return weight._version
    except RuntimeError:  # an inference tensor keeps no version counter (nor can it change outside inference mode)
        return -1


def panels(weight: torch.Tensor) -> torch.Tensor:
    """The packed copy of `weight` (`pack`), made on its first use and kept while the weight lives;
    made again when the weight changes (in place, or its storage replaced). It costs one more copy of
    each weight the kernel multiplies by — a model's linear layers twice in memory on a CPU."""
    key, state = id(weight), (weight.data_ptr(), _version(weight))
    hit = _packed.get(key)
    if hit is not None and hit[0]() is weight and hit[1] == state:
        return hit[2]

    def forget(ref: weakref.ref, key: int = key) -> None:
        if key in _packed and _packed[key][0] is ref:
            del _packed[key]

    p = pack(weight)
    _packed[key] = (weakref.ref(weight, forget), state, p)
    return p
