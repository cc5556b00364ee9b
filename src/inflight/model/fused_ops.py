"""The small operators between a decoder layer's matrix multiplies: RMSNorm (with the residual add),
the rotary embedding with the write of this step's keys and values into the cache, and SwiGLU's
`silu(gate) * up` — each as a plain-torch reference and, on the CPU in float32, one fused C pass.

Why fuse them: at a decode step's size (tens of rows of a few hundred floats) each torch operator
costs more in dispatch and allocation than in arithmetic, and the reference spends five to ten of
them per line of the model. vLLM fuses the same three places (`fused_add_rms_norm`,
`rotary_embedding` + `reshape_and_cache`, `silu_and_mul`) for the same reason on a GPU.

`csrc/layer_ops.c` repeats the reference's arithmetic operation for operation, without fused
multiply-adds, so the rotary embedding and the cache write agree with it to the bit. RMSNorm's
sum of squares (added in double here, in float by torch) and SiLU's exp are computed their own way:
a value moves by a few units in the last place at most (the norm: both are within about three of
the float64 answer, at any row length). Every row is computed alone, so no result depends on the rest of the batch. Anything
else — another dtype or device, a tensor that wants a gradient, no compiler, `INFLIGHT_CPU_KERNEL=0` —
runs the reference.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from inflight.model import c_build, thread_pool
from inflight.model.attention import write_kv

__all__ = ["rms_norm", "silu_and_mul", "rotary_and_cache", "apply_rotary", "split_and_rotate", "load", "build_error",
           "reference_only", "runs_in_c", "rms_norm_reference", "silu_and_mul_reference", "rotary_and_cache_reference"]

SOURCE = Path(__file__).with_name("csrc") / "layer_ops.c"
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=gnu99", "-ffp-contract=off"]
SYMBOLS = ("inflight_rms_norm_f32", "inflight_silu_and_mul_f32", "inflight_rotary_and_cache_f32", "inflight_use_pool",
           "inflight_parallel_backend")
_state: dict = {}  # "off": how many `reference_only()` blocks are open


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.inflight_rms_norm_f32.argtypes = [p, p, p, i64, i64, ctypes.c_float, p, i32]
    lib.inflight_rms_norm_f32.restype = None
    lib.inflight_silu_and_mul_f32.argtypes = [p, i64, i64, p, i32]
    lib.inflight_silu_and_mul_f32.restype = None
    lib.inflight_rotary_and_cache_f32.argtypes = [p, i64, i64, i64, i64, p, p, p, p, i64, p, i32]
    lib.inflight_rotary_and_cache_f32.restype = ctypes.c_int
    thread_pool.attach(lib)


_library = c_build.LazyLibrary(SOURCE, FLAGS, SYMBOLS, _declare)


def load() -> ctypes.CDLL | None:
    """The compiled operators (built on first use, cached per machine by `c_build`), or None."""
    return _library.load()


def build_error() -> str | None:
    """Why `load()` returned None (None if it hasn't been tried or it worked)."""
    return _library.build_error()


@contextmanager
def reference_only():
    """Inside this block every operator here, and `skinny_gemm.linear`, runs its torch reference (how
    the side-by-side benchmark, `python -m inflight.bench.kernels.cpu`, measures what they are worth)."""
    _state["off"] = _state.get("off", 0) + 1
    try:
        yield
    finally:
        _state["off"] -= 1


def runs_in_c(*tensors: torch.Tensor) -> bool:
    """Whether a C pass may take these tensors: contiguous float32 CPU tensors that want no gradient,
    outside `reference_only()` (also asked by `skinny_gemm`, which has its own library)."""
    if _state.get("off"):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:  # (`is_cpu`, not `device.type`: a device object is built at each asking, 0.4 us a tensor)
        if t.dtype is not torch.float32 or not t.is_cpu or not t.is_contiguous() or (grad and t.requires_grad):
            return False
    return True


def _fusable(*tensors: torch.Tensor) -> bool:
    """Whether the C pass here may take these: see `runs_in_c`, and the library must have built."""
    return runs_in_c(*tensors) and load() is not None


# --- the torch references (the definition; the C must agree with these) ----------------------------

def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """weight * x / sqrt(mean(x^2) + eps), normalised in float32 like Hugging Face. With `residual`,
    x is first added to it: returns (normalised, residual + x), the residual stream's new sum."""
    if residual is not None:
        x = residual + x
        residual = x
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(dtype)
    return out if residual is None else (out, residual)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x `[..., 2 * inter]` = gate | up  ->  silu(gate) * up `[..., inter]` (SwiGLU's middle)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x `[..., heads, D]` (Hugging Face's rotate-half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def split_and_rotate(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                     head_dim: int):
    """q, k (rotated) and v `[..., heads, D]` of a fused projection `[..., (H + 2 KV) D]`; cos/sin
    `[..., 1, D]` broadcast over the heads."""
    qk_size = (num_heads + num_kv_heads) * head_dim
    # rotate q and k together: they are adjacent columns of the fused projection
    qk = apply_rotary(qkv[..., :qk_size].unflatten(-1, (num_heads + num_kv_heads, head_dim)), cos, sin)
    q, k = qk.split([num_heads, num_kv_heads], dim=-2)
    return q, k, qkv[..., qk_size:].unflatten(-1, (num_kv_heads, head_dim))


def rotary_and_cache_reference(qkv, cos, sin, k_cache, v_cache, slot_mapping, num_heads: int, num_kv_heads: int):
    """Split qkv `[T, (H + 2 KV) D]`, rotate q and k with cos/sin `[T, 1, D]`, write k and v into
    their slots of one layer's cache -> q `[T, H, D]`."""
    q, k, v = split_and_rotate(qkv, cos, sin, num_heads, num_kv_heads, k_cache.shape[-1])
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    return q


# --- what the model calls: the C pass where it can run, else the reference --------------------------

def _call(name: str, fn, *args):
    """fn(*args), shown in torch.profiler tables as `inflight::<name>_c`."""
    return c_build.profiled_call(f"inflight::{name}_c", fn, *args)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm, fused with the residual add when `residual` is given (vLLM's `fused_add_rms_norm`):
    see `rms_norm_reference`. The C pass updates `residual` in place."""
    tensors = (x, weight) if residual is None else (x, weight, residual)
    if not _fusable(*tensors) or x.shape[-1] != weight.numel() or (residual is not None and residual.shape != x.shape):
        return rms_norm_reference(x, weight, eps, residual)
    out = torch.empty_like(x)
    args = (x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(),
            x.numel() // max(1, x.shape[-1]), x.shape[-1], eps, out.data_ptr(), thread_pool.threads())
    _call("rms_norm", _library.lib.inflight_rms_norm_f32, *args)
    return out if residual is None else (out, residual)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of x = gate | up (vLLM's `silu_and_mul`): see `silu_and_mul_reference`."""
    if not _fusable(x) or x.shape[-1] % 2:
        return silu_and_mul_reference(x)
    inter = x.shape[-1] // 2
    out = x.new_empty(*x.shape[:-1], inter)
    args = (x.data_ptr(), x.numel() // max(1, x.shape[-1]), inter, out.data_ptr(), thread_pool.threads())
    _call("silu_and_mul", _library.lib.inflight_silu_and_mul_f32, *args)
    return out


def rotary_and_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Rotate q and k of the fused projection and write k and v into one layer's cache (vLLM's rotary
    embedding followed by `reshape_and_cache`) -> q `[T, H, D]`: see `rotary_and_cache_reference`.
    The C pass rotates qkv in place."""
    T, D = qkv.shape[0], k_cache.shape[-1]
    fits = (qkv.dim() == 2 and qkv.shape[1] == (num_heads + 2 * num_kv_heads) * D and D % 2 == 0
            and k_cache.dim() == 4 and k_cache.shape[2] == num_kv_heads and v_cache.shape == k_cache.shape
            and cos.shape == sin.shape and cos.numel() == T * D and slot_mapping.dtype == torch.int64
            and slot_mapping.shape == (T,) and slot_mapping.device.type == "cpu" and slot_mapping.is_contiguous())
    if not fits or not _fusable(qkv, cos, sin, k_cache, v_cache):
        return rotary_and_cache_reference(qkv, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads)
    slots = k_cache.shape[0] * k_cache.shape[1]
    args = (qkv.data_ptr(), T, num_heads, num_kv_heads, D, cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(),
            v_cache.data_ptr(), slots, slot_mapping.data_ptr(), thread_pool.threads())
    rc = _call("rotary_and_cache", _library.lib.inflight_rotary_and_cache_f32, *args)
    if rc != 0:  # checked before anything was written
        raise IndexError(f"token {-1 - rc}: slot {int(slot_mapping[-1 - rc])} is outside the cache ({slots} slots)")
    return qkv[:, :num_heads * D].unflatten(-1, (num_heads, D))
