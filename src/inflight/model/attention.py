"""Paged attention over a ragged batch: a plain-torch reference and a dispatcher to a Triton kernel.

The reference reads keys and values where they live, through the block tables. A step's decodes
(one query each) are one sparse attention pattern over the cache (`AttentionMetadata.decode_pattern`):
each query row sees exactly the cache rows of its own context, so three operations serve any mix
of context lengths with no padding and no copy of the cache —
`torch.sparse.sampled_addmm` computes the scores q·k only where the pattern allows, a softmax per
row, and `F.embedding_bag` sums the value rows weighted by the probabilities. Prefill chunks (many
queries each, causal) gather their sequences' keys and values and run one padded
`scaled_dot_product_attention` for all of them. The indices and masks are computed once per step
and read by every layer.

`AttentionBackend` chooses the implementation per call: a decode kernel takes the step's decodes
where one runs — the Triton kernel on CUDA, the small C kernel of `cpu_attention` on a CPU in
float32 (built on first use where a C compiler exists) — and the reference the prefill chunks (a
mixed step is split so that its decodes still take the kernel). The C kernel also takes whole steps
whose contexts are short, prompts included (`C_PREFILL_MAX_CONTEXT`). Everywhere else the
reference. The model holds one `AttentionBackend`, which remembers what ran last and whether a
kernel failed.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from inflight.model import cpu_attention
from inflight.model.attention_metadata import AttentionMetadata, DecodePattern, PrefillBatch

__all__ = ["write_kv", "paged_attention", "AttentionBackend", "BACKENDS"]

BACKENDS = ("auto", "torch", "triton", "c")


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter new keys/values `[T, kv_heads, head_dim]` into their slots of one layer's cache."""
    nb, bs, kvh, d = k_cache.shape
    k_cache.view(nb * bs, kvh, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, kvh, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _check_heads(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{q.shape[1]} query heads is not a multiple of {k_cache.shape[2]} kv heads")


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float) -> torch.Tensor:
    """Reference attention for a mixed prefill/decode batch: q `[T, H, D]` -> `[T, H, D]`.

    Causal within each sequence, over everything in its cache (earlier chunks included); grouped-query
    attention when H is a multiple of the cache's kv heads."""
    _check_heads(q, k_cache)
    pattern = meta.decode_pattern(q.shape[1], k_cache.shape[2])
    if pattern is not None and pattern.in_batch_order:  # a decode-only step: nothing to put back
        return decode_reference(q, k_cache, v_cache, pattern, scale)
    out = q.new_empty(q.shape)
    if pattern is not None:
        out.index_copy_(0, pattern.rows, decode_reference(q, k_cache, v_cache, pattern, scale))
    prefill = meta.prefill_batch
    if prefill is not None:
        out.index_copy_(0, prefill.rows, prefill_reference(q, k_cache, v_cache, prefill, scale))
    return out


def _rows(cache: torch.Tensor) -> torch.Tensor:
    """One layer's cache `[blocks, block_size, kvh, D]` as rows `[slots * kvh, D]` (a view)."""
    return cache.view(-1, cache.shape[-1])


def decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pattern: DecodePattern,
                     scale: float) -> torch.Tensor:
    """The step's decodes through their sparse pattern: `[n, H, D]`, in `pattern.rows` order."""
    H, D = q.shape[1:]
    qd = (q if pattern.in_batch_order else q.index_select(0, pattern.rows)).reshape(-1, D)  # [n * H, D]
    k_rows, v_rows = _rows(k_cache), _rows(v_cache)
    scores = _sampled_scores(qd, k_rows, pattern, scale)  # [nnz]: q·k for every (query row, key it sees)
    # softmax per query row, normalised at the end (as flash attention does): the value rows summed
    # with weights exp(score - row max), then divided by the sum of those weights
    # (the pattern is valid by construction: `unsafe` skips re-checking it, and output_size a sync)
    row_max = torch.segment_reduce(scores, "max", offsets=pattern.crow, unsafe=True)
    weights = (scores - row_max.repeat_interleave(pattern.lengths, output_size=scores.numel())).exp_()
    total = torch.segment_reduce(weights, "sum", offsets=pattern.crow, unsafe=True)
    out = F.embedding_bag(pattern.cols, v_rows, pattern.crow, mode="sum", per_sample_weights=weights.to(v_rows.dtype),
                          include_last_offset=True)
    return (out / total[:, None]).to(q.dtype).view(-1, H, D)


def _sampled_scores(qd: torch.Tensor, k_rows: torch.Tensor, pattern: DecodePattern, scale: float) -> torch.Tensor:
    """scale·q·k for each nonzero of the pattern, in float32 (or float64)."""
    if qd.dtype in (torch.float32, torch.float64) and k_rows.dtype == qd.dtype:
        # the dense product Q·K^T evaluated only at the pattern's nonzeros; K is read in place (the
        # values are zeros, not empty: with beta=0 the CPU kernel still multiplies them, so NaN garbage would leak)
        with warnings.catch_warnings():  # "sparse CSR support is in beta": these few operations are not
            warnings.simplefilter("ignore", UserWarning)
            csr = torch.sparse_csr_tensor(pattern.crow, pattern.cols, qd.new_zeros(pattern.cols.numel()),
                                          size=(qd.shape[0], k_rows.shape[0]), check_invariants=False)
        return torch.sparse.sampled_addmm(csr, qd, k_rows.t(), beta=0.0, alpha=scale).values()
    # half precision (PyTorch's sampled_addmm is float32/64 only): the same products from gathered rows
    q_of = torch.repeat_interleave(qd.float(), pattern.lengths, dim=0)
    return (k_rows.index_select(0, pattern.cols).float() * q_of).sum(-1) * scale


def prefill_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PrefillBatch,
                      scale: float) -> torch.Tensor:
    """The step's prefill chunks in one padded SDPA: `[n, H, D]` for the tokens `batch.rows`."""
    H, D = q.shape[1:]
    kvh = k_cache.shape[2]
    S, _, Q, L = batch.bias.shape
    grid = q.new_zeros(S * Q, H, D).index_copy_(0, batch.grid, q.index_select(0, batch.rows))
    k = k_cache.view(-1, kvh, D).index_select(0, batch.slots).view(S, L, kvh, D).transpose(1, 2).to(q.dtype)
    v = v_cache.view(-1, kvh, D).index_select(0, batch.slots).view(S, L, kvh, D).transpose(1, 2).to(q.dtype)
    o = F.scaled_dot_product_attention(grid.view(S, Q, H, D).transpose(1, 2), k, v, attn_mask=batch.bias.to(q.dtype),
                                       scale=scale, enable_gqa=H != kvh)  # [S, H, Q, D]
    return o.transpose(1, 2).reshape(S * Q, H, D).index_select(0, batch.grid)


def _kernel_device(q: torch.Tensor) -> bool:
    """Whether the Triton kernel runs where q lives (CUDA); a seam for tests on a CPU."""
    return q.is_cuda


def _load_triton_decode():
    """The Triton decode kernel, or None where it cannot be imported (no triton, or a broken one)."""
    try:
        from inflight.model.triton_attention import paged_decode_attention  # written by the paged-KV chapter
    except Exception:
        return None
    return paged_decode_attention


def _load_cpu_decode():
    """The C decode kernel, or None where it can't be built (no compiler; `cpu_attention.build_error()`)."""
    return cpu_attention.paged_decode_attention_cpu if cpu_attention.load() is not None else None


#: the longest context for which the C kernel also takes prefill chunks, one query per token (longer
#: prompts go to the reference's batched SDPA, whose blocked matmuls win there: on the book's 2-core
#: CPU the two cost the same at 512 keys, and the C kernel is ~3x cheaper at 128)
C_PREFILL_MAX_CONTEXT = 512


def _whole_step_in_c(kernel_name: str, meta: AttentionMetadata) -> bool:
    """Whether the C kernel takes the whole step, prefill chunks included."""
    return kernel_name == "c" and meta.max_context_len <= C_PREFILL_MAX_CONTEXT


class AttentionBackend:
    """Chooses the attention implementation per call and remembers what it did.

    `name` = "auto" (a decode kernel for the decodes where one runs — Triton on CUDA, C on a CPU in
    float32 — and the reference for everything else), "torch" (always the reference), "triton" or
    "c" (that kernel for decode-only steps, or an error where it can't run). `last_used` is "torch",
    "triton" or "c" after a call; `kernel_error` is set when a kernel raised here, after which
    "auto" stops trying kernels."""

    def __init__(self, name: str = "auto"):
        if name not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
        self.name = name
        self.last_used: str | None = None
        self.kernel_error: str | None = None

    def __repr__(self) -> str:
        return f"AttentionBackend({self.name!r}, last_used={self.last_used!r})"

    def kernel(self, q: torch.Tensor, k_cache: torch.Tensor):
        """(name, decode kernel) that this backend may call now for these tensors, or None."""
        if self.kernel_error is not None:
            return None
        if _kernel_device(q):
            fn = _load_triton_decode()
            return None if fn is None else ("triton", fn)
        if cpu_attention.supports(q, k_cache):
            fn = _load_cpu_decode()
            return None if fn is None else ("c", fn)
        return None

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                 scale: float) -> torch.Tensor:
        """Attention for one layer: q `[T, H, D]` of the step described by `meta` -> `[T, H, D]`."""
        if self.name in ("triton", "c"):
            return self._kernel_only(q, k_cache, v_cache, meta, scale)
        kernel = self.kernel(q, k_cache) if self.name == "auto" else None
        if kernel is not None and (meta.decode_batch is not None or _whole_step_in_c(kernel[0], meta)):
            out = self._with_kernel(kernel, q, k_cache, v_cache, meta, scale)
            if out is not None:
                return out
        self.last_used = "torch"
        return paged_attention(q, k_cache, v_cache, meta, scale)

    def _with_kernel(self, kernel, q, k_cache, v_cache, meta, scale) -> torch.Tensor | None:
        """Decodes through the kernel, prefill chunks through the reference; None if the kernel failed."""
        name, fn = kernel
        _check_heads(q, k_cache)
        dec = meta.decode_batch
        try:
            if meta.is_decode:
                out = fn(q, k_cache, v_cache, dec.block_tables, dec.context_lens, scale)
            elif _whole_step_in_c(name, meta):  # short prompts: every token a query over its own prefix
                tok = meta.token_batch
                out = fn(q, k_cache, v_cache, tok.block_tables, tok.context_lens, scale)
            else:
                out = q.new_empty(q.shape)
                out[dec.rows] = fn(q[dec.rows], k_cache, v_cache, dec.block_tables, dec.context_lens, scale)
                pre = meta.prefill_batch
                out[pre.rows] = prefill_reference(q, k_cache, v_cache, pre, scale)
        except Exception as exc:  # e.g. a Triton/driver combination that can't compile it (old GPUs)
            self.kernel_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"the {name} decode kernel failed here ({self.kernel_error[:300]}); "
                          "using the plain-torch reference attention from now on", RuntimeWarning, stacklevel=3)
            return None
        self.last_used = name
        return out

    def _kernel_only(self, q, k_cache, v_cache, meta, scale) -> torch.Tensor:
        if not meta.is_decode:
            raise RuntimeError(f"the {self.name} kernel handles decode-only batches (every query_len 1)")
        if self.name == "triton":
            fn = _load_triton_decode()
            if fn is None:
                raise RuntimeError("backend='triton' asked for, but inflight.model.triton_attention could not be imported")
        else:
            if not cpu_attention.supports(q, k_cache):
                raise RuntimeError(f"backend='c' takes float32 tensors on the CPU; got {q.dtype} on {q.device}")
            fn = _load_cpu_decode()
            if fn is None:
                raise RuntimeError(f"backend='c' asked for, but the C kernel can't be built here: "
                                   f"{cpu_attention.build_error()}")
        self.last_used = self.name
        return fn(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)
