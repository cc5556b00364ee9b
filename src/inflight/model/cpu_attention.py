"""Paged decode attention on the CPU, as a small C kernel compiled on first use.

The plain-torch reference (`attention.decode_reference`) spends most of its time between operators:
a sparse product, two segment reductions, a gather-sum, each dispatched per layer with index
tensors built for it. `csrc/paged_decode.c` is the same algorithm in one loop nest — one work item
per (sequence, kv head) that reads each key and value row once, straight from its block, for every
query head sharing it — the CPU counterpart of the Triton kernel the GPU runs.

It is built with the machine's C compiler (`$CC` or `cc`; `-O3 -march=native`, OpenMP when the
compiler has it) into a cache folder (`$INFLIGHT_CACHE`, else `~/.cache/inflight`), keyed by the
source and flags, once per machine. Where there is no compiler, or it fails, `load()` returns None
with the reason in `build_error()`, and attention stays on the reference. `INFLIGHT_CPU_KERNEL=0`
turns it off. Float32 only: it is the exactness path (half precision on a CPU stays on the reference).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

__all__ = ["load", "build_error", "paged_decode_attention_cpu", "supports"]

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=gnu99"]
PROFILER_NAME = "inflight::paged_attention_c"  # how the kernel's calls appear in a torch.profiler table
_state: dict = {}  # "lib": the loaded library or None, "error": why not


def _cache_dir() -> Path:
    root = os.environ.get("INFLIGHT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "inflight")
    return Path(root)


def _cpu_id() -> str:
    """What `-march=native` compiled for: the CPU's model and feature flags (a home folder shared by
    machines with different CPUs must not hand one of them a library with instructions it lacks)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def _compile(cc: str, flags: list[str], target: Path) -> str | None:
    """Compile the kernel to `target` (atomically, so concurrent processes don't see half a file);
    the compiler's complaint, or None on success."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *flags, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return (r.stderr or r.stdout).strip()[-500:] or f"{cc} exited with {r.returncode}"
        os.replace(tmp, target)
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build() -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get("INFLIGHT_CPU_KERNEL", "1").strip() in ("0", "false", "no", "off"):
        return None, "turned off by INFLIGHT_CPU_KERNEL=0"
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        return None, f"no C compiler ({cc!r} not found)"
    src = SOURCE.read_bytes()
    errors = []
    for flags in (FLAGS + ["-fopenmp"], FLAGS):  # OpenMP threads where the compiler has them
        key = hashlib.sha256(src + " ".join([cc, *flags, platform.machine(), _cpu_id()]).encode()).hexdigest()[:16]
        target = _cache_dir() / f"paged_decode-{key}.so"
        try:
            err = None if target.exists() else _compile(cc, flags, target)
            if err is None:
                lib = ctypes.CDLL(str(target))
                _declare(lib)
                return lib, None
            errors.append(err)
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return None, f"could not build {SOURCE.name}: {errors[-1]}"


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.inflight_paged_decode_f32.argtypes = [p, p, p, i64, p, i64, p, i64, i64, i64, i64, i64, ctypes.c_float,
                                              p, i64, i32, p]
    lib.inflight_paged_decode_f32.restype = i32
    lib.inflight_paged_decode_openmp.restype = i32


def load() -> ctypes.CDLL | None:
    """The compiled kernel (built on the first call in this process), or None where it can't be."""
    if "lib" not in _state:
        _state["lib"], _state["error"] = _build()
    return _state["lib"]


def build_error() -> str | None:
    """Why `load()` returned None (None if it hasn't been tried or it worked)."""
    return _state.get("error")


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel can take this call: float32 tensors on the CPU, at most 64 query heads per kv head."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k_cache.dtype == torch.float32
            and q.shape[1] % k_cache.shape[2] == 0 and q.shape[1] // k_cache.shape[2] <= 64)


def paged_decode_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention, q `[n, H, D]` (one token per sequence) over the paged cache -> `[n, H, D]`;
    the same contract as the Triton kernel's `paged_decode_attention`."""
    lib = load()
    if lib is None:
        raise RuntimeError(f"the CPU attention kernel is unavailable: {build_error()}")
    if not supports(q, k_cache):
        raise ValueError(f"the CPU kernel takes float32 CPU tensors with H a multiple of kv heads (<= 64 per "
                         f"group); got {q.dtype} on {q.device}, {q.shape[1]} heads over {k_cache.shape[2]}")
    n, H, D = q.shape
    _, block_size, kvh, _ = k_cache.shape
    if (block_tables.dim() != 2 or block_tables.shape[0] != n or tuple(context_lens.shape) != (n,)
            or v_cache.shape != k_cache.shape or k_cache.shape[3] != D):
        raise ValueError(f"for n = {n} queries of head size {D}: block_tables must be [n, max_blocks], context_lens "
                         f"[n], both caches [blocks, block_size, kv_heads, {D}]; got {tuple(block_tables.shape)}, "
                         f"{tuple(context_lens.shape)}, {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    threads = max(1, torch.get_num_threads())
    # scores of one work item: G heads x its context (no more than its block table covers; the kernel
    # refuses a longer context before reading anything)
    longest = min(int(lens.max()), tables.shape[1] * block_size) if n else 1
    per_thread = (H // kvh) * max(1, longest)
    work = torch.empty(threads * per_thread, dtype=torch.float32)
    args = (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], tables.data_ptr(), tables.shape[1],
            lens.data_ptr(), n, H, kvh, D, block_size, scale, work.data_ptr(), per_thread, threads, out.data_ptr())
    if torch.autograd.profiler._is_profiler_enabled:  # a named range, so that op profiles show the kernel's time
        with torch.profiler.record_function(PROFILER_NAME):
            rc = lib.inflight_paged_decode_f32(*args)
    else:
        rc = lib.inflight_paged_decode_f32(*args)
    if rc <= -2:  # checked before any read: nothing outside the cache was touched
        i = -2 - rc
        raise ValueError(f"query {i}: context length {int(lens[i])} with block table {tables[i].tolist()[:8]}... "
                         f"reads outside the cache ({k_cache.shape[0]} blocks of {block_size})")
    if rc != 0:
        raise RuntimeError(f"the CPU attention kernel refused the shapes (q {tuple(q.shape)}, cache {tuple(k_cache.shape)})")
    return out
