"""Paged decode attention as a Triton kernel: K and V are read straight from the cache blocks
through the block table, never gathered into a contiguous copy.

One program per (sequence, kv head). It loads the query rows of every query head that shares that
kv head (GQA), then walks the sequence's context `BLOCK_N` tokens at a time — each token's slot is
looked up in the block table, so any `block_size` works — keeping an online softmax (running max,
running sum, fp32 accumulator) as FlashAttention does. Memory traffic is one read of the
sequence's K and V per kv head, which is the least a decode step can do.

Triton is optional: this module imports without it (`HAS_TRITON` is then False) and
`paged_decode_attention` raises a clear error. On a CPU, `TRITON_INTERPRET=1` set before triton is
imported runs the same kernel on CPU tensors (slowly) — that is how the tests check it.
"""
from __future__ import annotations

import math
import os

import torch

try:  # optional dependency: the rest of the package never needs it
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "is_available", "paged_decode_attention"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def is_available(device: torch.device | str | None = None) -> bool:
    """Whether the kernel can run on `device`: Triton installed and a CUDA device (or the interpreter)."""
    if not HAS_TRITON:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    dev = torch.device(device) if device is not None else None
    return torch.cuda.is_available() and (dev is None or dev.type == "cuda")


if HAS_TRITON:

    @triton.jit
    def _paged_decode_kernel(
        Q, K, V, O, BT, CL,
        stride_qs, stride_qh,
        stride_kb, stride_kt, stride_kh,
        stride_vb, stride_vt, stride_vh,
        stride_os, stride_oh,
        stride_bts,
        qk_scale,  # softmax scale * log2(e): the kernel works in base 2
        block_size,  # a runtime int: a contiguous cache (block = max length) needs no recompile per length
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kvh = tl.program_id(1)
        ctx = tl.load(CL + seq)

        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        g_mask = g < GROUP
        d_mask = d < HEAD_DIM
        heads = kvh * GROUP + g  # query heads served by this kv head (repeat_kv order)

        q = tl.load(Q + seq * stride_qs + heads[:, None] * stride_qh + d[None, :],
                    mask=g_mask[:, None] & d_mask[None, :], other=0.0)

        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)

        for start in range(0, ctx, BLOCK_N):
            pos = start + n
            valid = pos < ctx
            # the block table turns a logical position into a physical block; one lookup per token
            block = tl.load(BT + seq * stride_bts + pos // block_size, mask=valid, other=0).to(tl.int64)
            offset = pos % block_size
            kv_mask = valid[:, None] & d_mask[None, :]
            k = tl.load(K + block[:, None] * stride_kb + offset[:, None] * stride_kt + kvh * stride_kh + d[None, :],
                        mask=kv_mask, other=0.0)
            v = tl.load(V + block[:, None] * stride_vb + offset[:, None] * stride_vt + kvh * stride_vh + d[None, :],
                        mask=kv_mask, other=0.0)

            # scores [BLOCK_G, BLOCK_N]: the GQA group is padded to >= 16 rows so tl.dot (tensor
            # cores) applies; the padding costs FLOPs, not memory traffic, and decode is memory-bound
            if DOT_FP32:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(valid[None, :], s * qk_scale, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if DOT_FP32:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty context gives zeros, not NaN
        tl.store(O + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
                 out.to(O.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """Decode attention of one new token per sequence over its paged K/V.

    q [S, H, D]; k_cache, v_cache [num_blocks, block_size, kv_heads, D]; block_tables [S, M] int32;
    context_lens [S] int32 (tokens in the cache, the new one included); returns [S, H, D] in q's dtype.
    """
    if not HAS_TRITON:
        raise RuntimeError("paged_decode_attention needs triton (pip install triton); "
                           "use inflight.model.attention.paged_attention, the plain-torch reference, instead")
    if q.dim() != 3:
        raise ValueError(f"q must be [num_seqs, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, kv_heads, head_dim], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    S, H, D = q.shape
    num_blocks, block_size, kv_heads, d_cache = k_cache.shape
    if d_cache != D:
        raise ValueError(f"head_dim differs: q has {D}, the cache has {d_cache}")
    if H % kv_heads:
        raise ValueError(f"num_heads ({H}) must be a multiple of kv_heads ({kv_heads}) for GQA")
    if q.dtype not in _DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q, k_cache, v_cache must share one dtype of {_DTYPES}, got "
                        f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != S:
        raise ValueError(f"block_tables must be [num_seqs={S}, max_blocks], got {tuple(block_tables.shape)}")
    if context_lens.shape != (S,):
        raise ValueError(f"context_lens must be [num_seqs={S}], got {tuple(context_lens.shape)}")
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise TypeError(f"block_tables and context_lens must be int32, got {block_tables.dtype}, {context_lens.dtype}")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, context_lens)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)

    # the kernel assumes a unit stride along head_dim; everything else goes through strides
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    out = torch.empty_like(q)
    if S == 0:
        return out

    group = H // kv_heads
    block_g = max(16, triton.next_power_of_2(group))  # tl.dot wants >= 16 rows
    block_d = max(16, triton.next_power_of_2(D))
    if block_n is None:
        # tokens per loop step: several blocks at once keeps enough loads in flight
        block_n = 64 if block_d <= 128 else 32
    # fp32 inputs keep full fp32 products (no TF32). Triton's CPU interpreter gets bf16 tl.dot
    # wrong (triton 3.x), so under the interpreter bf16 is upcast too; on a GPU bf16 stays native.
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    dot_fp32 = q.dtype == torch.float32 or (interpreting and q.dtype == torch.bfloat16)
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    _paged_decode_kernel[(S, kv_heads)](
        q, k_cache, v_cache, out, block_tables, context_lens,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_tables.stride(0),
        float(scale) * 1.4426950408889634,
        block_size,
        GROUP=group, HEAD_DIM=D,
        BLOCK_G=block_g, BLOCK_D=block_d, BLOCK_N=block_n, DOT_FP32=dot_fp32,
    )
    return out
