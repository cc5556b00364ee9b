"""Paged decode attention as Triton kernels: K and V are read straight from the cache blocks
through the block table, never gathered into a contiguous copy.

A decode step reads every cached key and value once and does little arithmetic with them, so it is
bound by memory bandwidth — and a GPU only reaches its bandwidth when every multiprocessor (SM) has
enough loads in flight. One program per (sequence, kv head) gives 256 programs at batch 32 on a
Llama-3-8B layer (8 kv heads), two per SM of an H200, each walking thousands of tokens alone.

So the context is cut into **partitions** (the idea of FlashDecoding, Dao et al. 2023, and of vLLM's
`paged_attention_v2`): the grid is (sequence, kv head, partition), and each program attends its
query heads over one slice of the context only. Softmax over the whole context is still exact,
because softmax over a union of slices can be rebuilt from each slice's own summary: its largest
score `m`, its sum of `exp(score - m)` `l`, and its normalised output `o`. A second, small kernel
rescales each slice by `l · exp(m - max m)` (the log-sum-exp trick) and adds them up. With one
partition the first kernel writes the output itself and the second is skipped.

Inside a program, the slice is walked one tile of `block_n` tokens at a time (four blocks of 16 at
the default 64), with FlashAttention's online softmax (running max, running sum, fp32
accumulator). A token's keys for one kv head are `head_dim` contiguous values (256 bytes at
head_dim 128, fp16), loaded as 16-byte vectors; its block comes from the block table (a shift and
a mask when `block_size` is a power of two, a division otherwise, so any block size works). All
query heads that share the kv head (GQA) are one tile of rows, so scores and outputs are `tl.dot`s
on the tensor cores (the group padded to 16 rows costs arithmetic, not memory traffic).

How many partitions: `plan_decode` splits only until the grid has about `PROGRAMS_PER_SM`
programs per SM, and never makes a partition shorter than `MIN_PARTITION_TILES` tiles, so that the
partials each program writes (and the reduction reads back) stay a small fraction of the K/V it
reads. Big batches get one partition, i.e. the single-pass kernel. The context bound comes from the
block table's width, so planning needs no device-to-host copy.

Triton is optional: this module imports without it (`HAS_TRITON` is then False) and
`paged_decode_attention` raises a clear error. On a CPU, `TRITON_INTERPRET=1` set before triton is
imported runs the same kernels on CPU tensors (slowly) — that is how the tests check them.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

try:  # optional dependency: the rest of the package never needs it
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "DecodePlan", "combine_partitions", "is_available", "paged_decode_attention", "plan_decode",
           "sm_count", "PROGRAMS_PER_SM", "MIN_PARTITION_TILES"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634

# Programs per SM the split aims for. A program holds about one K/V tile (32 KB) in flight, and
# 4-5 fit on an SM at once (registers, shared memory), so this is ~3 waves: enough that the last,
# partial wave still keeps the memory busy. A reasoned guess, not yet measured on a GPU:
# `python -m inflight.bench.kernels.attention --sweep` times every partition size beside this choice.
PROGRAMS_PER_SM = 16
# A partition's partials are (head_dim + 2) fp32 per query head; at 4 tiles of 64 tokens they are
# under 2 % of the K/V bytes the partition reads (GQA 4, head_dim 128).
MIN_PARTITION_TILES = 4
_COMBINE_BLOCK_P = 16  # partitions the reduction loads per step


def is_available(device: torch.device | str | None = None) -> bool:
    """Whether the kernel can run on `device`: Triton installed and a CUDA device (or the interpreter)."""
    if not HAS_TRITON:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    dev = torch.device(device) if device is not None else None
    return torch.cuda.is_available() and (dev is None or dev.type == "cuda")


@dataclass(frozen=True)
class DecodePlan:
    """How one call cuts the work: tokens per tile, tokens per partition, partitions per sequence."""

    block_n: int
    partition_size: int
    num_partitions: int

    @property
    def split(self) -> bool:
        return self.num_partitions > 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def plan_decode(num_seqs: int, kv_heads: int, head_dim: int, max_context: int, num_sms: int, *,
                partition_size: int | None = None, block_n: int | None = None) -> DecodePlan:
    """Choose the tile and the partitioning for a decode batch (pure arithmetic, no GPU needed).

    `max_context` bounds every sequence's context (the block table's width × block size);
    `num_sms` is the GPU's multiprocessor count. A given `partition_size` is rounded up to whole
    tiles; one at least `max_context` long means one partition (the single-pass kernel).
    """
    if block_n is None:
        block_n = 64 if head_dim <= 128 else 32  # one K tile + one V tile stay 32 KB in fp16
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    if partition_size is not None and (not isinstance(partition_size, int) or partition_size < 1):
        raise ValueError(f"partition_size must be a positive int (tokens), got {partition_size!r}")
    tiles = max(1, -(-max_context // block_n))
    if partition_size is None:
        programs = max(1, num_seqs * kv_heads)
        wanted = -(-PROGRAMS_PER_SM * max(1, num_sms) // programs)  # partitions that fill the SMs
        parts = max(1, min(wanted, tiles // MIN_PARTITION_TILES))
        tiles_per_part = -(-tiles // parts)
    else:
        tiles_per_part = min(tiles, -(-partition_size // block_n))
    return DecodePlan(block_n, tiles_per_part * block_n, -(-tiles // tiles_per_part))


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; the interpreter runs programs one after another, so it counts as one."""
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 1


if HAS_TRITON:

    @triton.jit
    def _paged_decode_kernel(
        Q, K, V, O, M, L, BT, CL,
        stride_qs, stride_qh,
        stride_kb, stride_kt, stride_kh,
        stride_vb, stride_vt, stride_vh,
        stride_os, stride_oh, stride_op,  # O: the output [S, H, D], or the partial outputs [S, H, P, D]
        stride_ms, stride_mh,  # M, L: each partition's max score and sum of exponentials [S, H, P]
        stride_bts,
        qk_scale,  # softmax scale * log2(e): the kernel works in base 2
        block_size, block_shift,  # runtime ints: no recompile per block size
        max_context, partition_size,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
        POW2_BLOCKS: tl.constexpr, SPLIT: tl.constexpr, DOT_FP32: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kvh = tl.program_id(1)
        part = tl.program_id(2)
        # clamped to the block table's capacity, so a bad context length can never read past it
        ctx = tl.minimum(tl.load(CL + seq), max_context)
        start = part * partition_size
        end = tl.minimum(start + partition_size, ctx)  # start >= end: an empty partition, no loop

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

        for tile in range(start, end, BLOCK_N):
            pos = tile + n
            valid = pos < end
            # the block table turns a logical position into a physical block
            if POW2_BLOCKS:
                logical = pos >> block_shift
                offset = pos & (block_size - 1)
            else:
                logical = pos // block_size
                offset = pos % block_size
            block = tl.load(BT + seq * stride_bts + logical, mask=valid, other=0).to(tl.int64)
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
        o_mask = g_mask[:, None] & d_mask[None, :]
        if SPLIT:
            # this partition's summary (an empty one writes m = -inf, l = 0, which the reduction skips)
            row = seq * stride_ms + heads * stride_mh + part
            tl.store(M + row, m_i, mask=g_mask)
            tl.store(L + row, l_i, mask=g_mask)
            tl.store(O + seq * stride_os + heads[:, None] * stride_oh + part * stride_op + d[None, :],
                     out, mask=o_mask)
        else:
            tl.store(O + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
                     out.to(O.dtype.element_ty), mask=o_mask)

    @triton.jit
    def _combine_partitions_kernel(
        O, PO, M, L, CL,
        stride_os, stride_oh,
        stride_pos, stride_poh, stride_pop,
        stride_ms, stride_mh,
        max_context, partition_size,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
    ):
        """One program per (sequence, query head): the log-sum-exp rescale of its partitions."""
        seq = tl.program_id(0)
        head = tl.program_id(1)
        ctx = tl.minimum(tl.load(CL + seq), max_context)
        n_parts = tl.cdiv(ctx, partition_size)  # partitions that hold tokens
        p = tl.arange(0, BLOCK_P)
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        row = seq * stride_ms + head * stride_mh

        m_run = tl.full([BLOCK_P], float("-inf"), tl.float32)
        for p0 in range(0, n_parts, BLOCK_P):  # pass 1: the largest score of the whole context
            m_run = tl.maximum(m_run, tl.load(M + row + p0 + p, mask=p0 + p < n_parts, other=float("-inf")))
        m_all = tl.max(m_run, axis=0)

        weight_sum = tl.zeros([BLOCK_P], tl.float32)
        acc = tl.zeros([BLOCK_P, BLOCK_D], tl.float32)
        for p0 in range(0, n_parts, BLOCK_P):  # pass 2: each partition weighted by l * exp(m - m_all)
            p_mask = p0 + p < n_parts
            m = tl.load(M + row + p0 + p, mask=p_mask, other=float("-inf"))
            l = tl.load(L + row + p0 + p, mask=p_mask, other=0.0)
            w = l * tl.exp2(m - m_all)
            o = tl.load(PO + seq * stride_pos + head * stride_poh + (p0 + p)[:, None] * stride_pop + d[None, :],
                        mask=p_mask[:, None] & d_mask[None, :], other=0.0)
            weight_sum += w
            acc += w[:, None] * o
        total = tl.sum(weight_sum, axis=0)
        out = tl.sum(acc, axis=0) / tl.where(total > 0, total, 1.0)  # no partition: zeros
        tl.store(O + seq * stride_os + head * stride_oh + d, out.to(O.dtype.element_ty), mask=d_mask)


def _check_inputs(q, k_cache, v_cache, block_tables, context_lens) -> None:
    """Shapes, dtypes and devices of a decode call; raises a ValueError/TypeError naming the problem."""
    if q.dim() != 3:
        raise ValueError(f"q must be [num_seqs, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, kv_heads, head_dim], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    S, H, D = q.shape
    kv_heads, d_cache = k_cache.shape[2], k_cache.shape[3]
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


def combine_partitions(partial_out: torch.Tensor, max_logits: torch.Tensor, exp_sums: torch.Tensor,
                       context_lens: torch.Tensor, partition_size: int, max_context: int,
                       out: torch.Tensor) -> torch.Tensor:
    """The reduction: write into `out` [S, H, D] the exact softmax output rebuilt from partitions.

    partial_out [S, H, P, D] fp32 holds each partition's normalised output, max_logits and exp_sums
    [S, H, P] fp32 its largest score (base 2, scale applied) and its sum of exp2(score - max).
    Only the first ceil(context_len / partition_size) partitions of a sequence are read.
    """
    S, H, _, D = partial_out.shape
    # the kernel reads max_logits and exp_sums through one set of strides (no copy when contiguous)
    partial_out, max_logits, exp_sums = (t.contiguous() for t in (partial_out, max_logits, exp_sums))
    _combine_partitions_kernel[(S, H)](
        out, partial_out, max_logits, exp_sums, context_lens,
        out.stride(0), out.stride(1),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        max_logits.stride(0), max_logits.stride(1),
        max_context, partition_size,
        HEAD_DIM=D, BLOCK_D=max(16, _next_pow2(D)), BLOCK_P=_COMBINE_BLOCK_P,
    )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    partition_size: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Decode attention of one new token per sequence over its paged K/V.

    q [S, H, D]; k_cache, v_cache [num_blocks, block_size, kv_heads, D]; block_tables [S, M] int32;
    context_lens [S] int32 (tokens in the cache, the new one included, at most M × block_size);
    returns [S, H, D] in q's dtype. `partition_size` (tokens) overrides `plan_decode`'s choice (a
    value >= M × block_size runs the single-pass kernel); `block_n`, `num_warps`, `num_stages` are
    tuning knobs for the benchmark (the last two are ignored by the interpreter).
    """
    if not HAS_TRITON:
        raise RuntimeError("paged_decode_attention needs triton (pip install triton); "
                           "use inflight.model.attention.paged_attention, the plain-torch reference, instead")
    _check_inputs(q, k_cache, v_cache, block_tables, context_lens)
    S, H, D = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    max_context = block_tables.shape[1] * block_size
    plan = plan_decode(S, kv_heads, D, max_context, sm_count(q.device), partition_size=partition_size, block_n=block_n)

    # the kernel assumes a unit stride along head_dim; everything else goes through strides
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    block_tables = block_tables.contiguous()
    context_lens = context_lens.contiguous()
    out = torch.empty_like(q)
    if S == 0:
        return out

    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    if not plan.split:
        _launch_decode(q, k_cache, v_cache, block_tables, context_lens, scale, plan, max_context, out, **launch)
        return out
    partial_out = torch.empty(S, H, plan.num_partitions, D, dtype=torch.float32, device=q.device)
    max_logits = torch.empty(S, H, plan.num_partitions, dtype=torch.float32, device=q.device)
    exp_sums = torch.empty_like(max_logits)
    _launch_decode(q, k_cache, v_cache, block_tables, context_lens, scale, plan, max_context, partial_out,
                   max_logits, exp_sums, **launch)
    return combine_partitions(partial_out, max_logits, exp_sums, context_lens, plan.partition_size, max_context, out)


def _launch_decode(q, k_cache, v_cache, block_tables, context_lens, scale: float, plan: DecodePlan,
                   max_context: int, target: torch.Tensor, max_logits: torch.Tensor | None = None,
                   exp_sums: torch.Tensor | None = None, **launch) -> None:
    """The partition kernel over grid (sequence, kv head, partition): into `target` = the output
    [S, H, D] (one partition) or the partial outputs [S, H, P, D] with their max_logits/exp_sums."""
    S, H, D = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = H // kv_heads
    if plan.split:
        o_strides = (target.stride(0), target.stride(1), target.stride(2))
        m_strides = (max_logits.stride(0), max_logits.stride(1))
    else:
        max_logits = exp_sums = target  # never touched by the single-pass kernel
        o_strides, m_strides = (target.stride(0), target.stride(1), 0), (0, 0)
    # fp32 inputs keep full fp32 products (no TF32). Triton's CPU interpreter gets bf16 tl.dot
    # wrong (triton 3.x), so under the interpreter bf16 is upcast too; on a GPU bf16 stays native.
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    _paged_decode_kernel[(S, kv_heads, plan.num_partitions)](
        q, k_cache, v_cache, target, max_logits, exp_sums, block_tables, context_lens,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        *o_strides, *m_strides,
        block_tables.stride(0),
        float(scale) * _LOG2E,
        block_size, max(0, block_size.bit_length() - 1),
        max_context, plan.partition_size,
        GROUP=group, HEAD_DIM=D,
        BLOCK_G=max(16, _next_pow2(group)),  # tl.dot wants >= 16 rows
        BLOCK_D=max(16, _next_pow2(D)), BLOCK_N=plan.block_n,
        POW2_BLOCKS=block_size & (block_size - 1) == 0, SPLIT=plan.split,
        DOT_FP32=q.dtype == torch.float32 or (interpreting and q.dtype == torch.bfloat16),
        **launch,
    )
