"""Paged decode attention on the CPU, as a small C kernel compiled on first use.

The plain-torch reference (`attention.decode_reference`) spends most of its time between operators:
a sparse product, two segment reductions, a gather-sum, each dispatched per layer with index
tensors built for it. `csrc/paged_decode.c` is the same algorithm in one loop nest — one work item
per sequence (or per (sequence, kv head) when the batch is small) that reads each key and value row
once, straight from its block, for every query head sharing it — the CPU counterpart of the Triton kernel the GPU runs.

It is built with the machine's C compiler (`$CC` or `cc`; `-O3 -march=native`) once per machine into
a cache folder, runs its work items on the package's thread pool (`thread_pool`), and checked before use (`c_build`). Where
there is no compiler, or the build fails, `load()` returns None with the reason in `build_error()`,
and attention stays on the reference. `INFLIGHT_CPU_KERNEL=0` turns it off. Float32 only: it is the
exactness path (half precision on a CPU stays on the reference).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from inflight.model import c_build, thread_pool

__all__ = ["load", "build_error", "parallel_backend", "paged_decode_attention_cpu", "supports",
           "workspace_per_thread"]

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
# -ffp-contract=off: every multiply-add is written out (csrc/vec8.h's fma8), none left to the compiler
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=gnu99", "-ffp-contract=off"]
SYMBOLS = ("inflight_paged_decode_f32", "inflight_use_pool", "inflight_parallel_backend")
PROFILER_NAME = "inflight::paged_attention_c"  # how the kernel's calls appear in a torch.profiler table
INT32_MAX = 2**31 - 1


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.inflight_paged_decode_f32.argtypes = [p, p, p, i64, p, i64, p, i64, i64, i64, i64, i64, ctypes.c_float,
                                              p, i64, i32, p]
    lib.inflight_paged_decode_f32.restype = i32
    _state["threads"] = thread_pool.attach(lib)


_library = c_build.LazyLibrary(SOURCE, FLAGS, SYMBOLS, _declare)
_state: dict[str, str] = {}  # "threads": what the loaded kernel's work runs on (thread_pool.BACKENDS)


def load() -> ctypes.CDLL | None:
    """The compiled kernel (built on the first call in this process), or None where it can't be."""
    return _library.load()


def parallel_backend() -> str | None:
    """What the loaded kernel spreads its work over (None if it isn't loaded): "inflight thread
    pool", "OpenMP" (`INFLIGHT_THREAD_POOL=0`, or no pool) or "one thread" (a compiler without OpenMP)."""
    return _state.get("threads") if load() is not None else None


def build_error() -> str | None:
    """Why `load()` returned None (None if it hasn't been tried or it worked)."""
    return _library.build_error()


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor | None = None) -> bool:
    """Whether the kernel can take this call: float32 tensors on the CPU, q `[n, H, D]` and caches
    `[blocks, block_size, kv_heads, D]` alike, H a multiple of kv_heads with at most 64 per group, and
    no gradient wanted (the kernel has no backward; training attends with SDPA anyway)."""
    v = k_cache if v_cache is None else v_cache
    if q.dim() != 3 or k_cache.dim() != 4 or v.shape != k_cache.shape or k_cache.shape[3] != q.shape[2]:
        return False
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in (q, k_cache, v)):
        return False
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    if kv_heads < 1 or heads % kv_heads or heads // kv_heads > 64:
        return False
    return not (torch.is_grad_enabled() and q.requires_grad)


#: the widest tile of a prompt's tokens the kernel takes (csrc/paged_decode.c's TL: 16 lanes with
#: AVX-512, else 8); the workspace below has room for it
TILE_LANES = 16


def workspace_per_thread(num_heads: int, head_size: int, longest: int, table_span: int) -> int:
    """Floats of scratch one thread needs: a lone query's scores and sums of weights (H heads x its context
    + 1), or a tile of a prompt's tokens (its queries transposed, their scores and sums: TILE_LANES x (D +
    the context + 1)) -- for a context no longer than the block table covers (the kernel refuses a longer
    one before reading anything)."""
    L = max(1, min(longest, table_span))
    return max(num_heads * (L + 1), TILE_LANES * (head_size + L + 1))


def paged_decode_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention, q `[n, H, D]` (one token per sequence) over the paged cache -> `[n, H, D]`;
    the same contract as the Triton kernel's `paged_decode_attention`."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"the CPU attention kernel is unavailable: {build_error()}")
    if not supports(q, k_cache, v_cache):
        raise ValueError(f"the CPU kernel takes float32 CPU tensors, q [n, H, D] and both caches [blocks, "
                         f"block_size, kv_heads, D] with H a multiple of kv_heads (<= 64 per group), no gradient; "
                         f"got q {q.dtype} {tuple(q.shape)} on {q.device}, caches {k_cache.dtype} "
                         f"{tuple(k_cache.shape)} / {v_cache.dtype} {tuple(v_cache.shape)} on {k_cache.device}")
    n, H, D = q.shape
    _, block_size, kvh, _ = k_cache.shape
    if block_tables.dim() != 2 or block_tables.shape[0] != n or tuple(context_lens.shape) != (n,):
        raise ValueError(f"for n = {n} queries: block_tables must be [n, max_blocks] and context_lens [n]; got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    for name, t, hi in (("block_tables", block_tables, k_cache.shape[0] - 1), ("context_lens", context_lens, INT32_MAX)):
        if t.dtype != torch.int32 and t.numel() and (int(t.min()) < 0 or int(t.max()) > hi):
            # checked before the int32 conversion, which would wrap 2**32 + b around to b
            raise ValueError(f"{name} holds values outside 0..{hi}: {int(t.min())}..{int(t.max())}")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    tables = block_tables.to(device="cpu", dtype=torch.int32).contiguous()
    lens = context_lens.to(device="cpu", dtype=torch.int32).contiguous()
    out = torch.empty_like(q)
    threads = max(1, thread_pool.threads())
    per_thread = workspace_per_thread(H, D, int(lens.max()) if n else 1, tables.shape[1] * block_size)
    work = torch.empty(threads * per_thread, dtype=torch.float32)
    args = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], tables.data_ptr(), tables.shape[1],
            lens.data_ptr(), n, H, kvh, D, block_size, scale, work.data_ptr(), per_thread, threads, out.data_ptr())
    rc = c_build.profiled_call(PROFILER_NAME, lib.inflight_paged_decode_f32, *args)
    if rc <= -2:  # checked before any read: nothing outside the cache was touched
        i = -2 - rc
        raise ValueError(f"query {i}: context length {int(lens[i])} with block table {tables[i].tolist()[:8]}... "
                         f"reads outside the cache ({k_cache.shape[0]} blocks of {block_size})")
    if rc != 0:
        raise RuntimeError(f"the CPU attention kernel refused the shapes (q {tuple(q.shape)}, cache {tuple(k_cache.shape)})")
    return out
