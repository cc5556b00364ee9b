"""The roofline of a decode step, as arithmetic: bytes over bandwidth against FLOPs over peak.

Chapter 1 argues with these formulas and chapter 6 prices preemption with them; the tests pin the
numbers the chapters quote. A decode step of `B` requests, each with `L` tokens in its KV cache,
reads every weight once (shared by the whole batch), reads every request's own KV cache (not
shared), and does about 2 FLOPs per parameter per request {Williams et al. 2009}:

    t_step ≈ max((weight_bytes + B·L·kv_bytes_per_token) / bandwidth,  2·params·B / peak_flops)

What follows from it, and why each function exists:

- `weight_ridge_batch`: where the *weight matmuls alone* turn compute-bound. It ignores the KV
  reads, so it is not where a decode step turns compute-bound.
- `kv_crossover_batch`: where the requests' KV reads equal the weight reads. Below it, an extra
  request costs little (the weights dominate the bytes); above it, the step time grows about in
  proportion to the batch — the end of "batching is nearly free".
- `intensity_limit`: the whole step's FLOPs per byte as the batch grows without bound. When it is
  below the device's FLOPs per byte (`compute_bound_context_limit` says from which context on),
  the step stays memory-bound at every batch size.
- `attention_intensity`: attention over the cache does only a few FLOPs per byte of K and V it
  reads (the GQA group size, in 16-bit), so it is bandwidth-bound however many requests share a step.

Torch-free, so Part I's chapters and the tests use it anywhere; inputs are plain numbers, checked
by `inflight.checks` (a non-number or a non-positive size is refused by name).
"""
from __future__ import annotations

from dataclasses import dataclass

from inflight.checks import number

__all__ = ["DecodeStep", "decode_step", "weight_ridge_batch", "kv_crossover_batch", "kv_crossover_context",
           "intensity_limit", "compute_bound_context_limit", "attention_intensity", "llama_weights",
           "recompute_attention_crossover", "PUBLISHED_PARAMETERS"]

#: Published parameter counts (model cards) of the models the chapters price; their shapes are in
#: `inflight.exercises.batching.MODEL_SHAPES` (the grader of chapter 1 uses them too).
PUBLISHED_PARAMETERS = {"Llama-2-7B": 6.74e9, "Llama-3-8B": 8.03e9, "Mistral-7B": 7.24e9,
                        "Llama-2-70B": 69.0e9, "Qwen2.5-0.5B": 0.49e9, "SmolLM2-135M": 0.135e9}


def _positive(name: str, value: float) -> float:
    return number(name, value, above=0.0)


@dataclass(frozen=True)
class DecodeStep:
    """One decode step on the roofline: what it reads, what it computes, and how long each takes."""

    batch: float
    context: float
    weight_bytes: float
    kv_bytes: float       # B·L·kv_bytes_per_token: every request's own cache, read once
    flops: float          # 2·params·B: the weight matmuls (attention's FLOPs are left out, as in the chapter)
    memory_s: float       # (weight_bytes + kv_bytes) / bandwidth
    compute_s: float      # flops / peak_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def time_s(self) -> float:
        """The roofline's estimate: the larger of the memory time and the compute time."""
        return max(self.memory_s, self.compute_s)

    @property
    def intensity(self) -> float:
        """FLOPs per byte read: the step is compute-bound only if this exceeds the device's."""
        return self.flops / self.bytes

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"


def decode_step(params: float, weight_bytes: float, kv_bytes_per_token: float, batch: float, context: float,
                peak_flops: float, bandwidth: float) -> DecodeStep:
    """The chapter's step-time formula for `batch` requests with `context` tokens of KV cache each."""
    params, weight_bytes = _positive("params", params), _positive("weight_bytes", weight_bytes)
    kv = _positive("kv_bytes_per_token", kv_bytes_per_token)
    batch, context = _positive("batch", batch), number("context", context, minimum=0.0)
    peak_flops, bandwidth = _positive("peak_flops", peak_flops), _positive("bandwidth", bandwidth)
    kv_bytes = batch * context * kv
    flops = 2 * params * batch
    return DecodeStep(batch, context, weight_bytes, kv_bytes, flops,
                      (weight_bytes + kv_bytes) / bandwidth, flops / peak_flops)


def weight_ridge_batch(peak_flops: float, bandwidth: float, bytes_per_param: float) -> float:
    """B* = peak/bandwidth × b/2: the batch at which a weight matmul (N·b bytes, 2·N·B FLOPs) turns
    compute-bound. The KV reads are not in it: for a whole decode step see `intensity_limit`."""
    return _positive("peak_flops", peak_flops) / _positive("bandwidth", bandwidth) \
        * _positive("bytes_per_param", bytes_per_param) / 2


def kv_crossover_batch(weight_bytes: float, context: float, kv_bytes_per_token: float) -> float:
    """The batch at which the requests' KV reads equal the weight reads: weight_bytes / (L·kv)."""
    return _positive("weight_bytes", weight_bytes) / (_positive("context", context)
                                                      * _positive("kv_bytes_per_token", kv_bytes_per_token))


def kv_crossover_context(weight_bytes: float, batch: float, kv_bytes_per_token: float) -> float:
    """The context at which `batch` requests' KV reads equal the weight reads: weight_bytes / (B·kv)."""
    return kv_crossover_batch(weight_bytes, batch, kv_bytes_per_token)  # the same product B·L


def intensity_limit(params: float, context: float, kv_bytes_per_token: float) -> float:
    """The decode step's FLOPs per byte as the batch grows without bound: 2·params / (L·kv).

    Every request brings 2·params FLOPs and L·kv bytes of its own, so past the crossover the
    step's intensity approaches this, whatever the batch."""
    return 2 * _positive("params", params) / (_positive("context", context)
                                              * _positive("kv_bytes_per_token", kv_bytes_per_token))


def compute_bound_context_limit(params: float, kv_bytes_per_token: float, peak_flops: float,
                                bandwidth: float) -> float:
    """The context beyond which a decode step is memory-bound at every batch size: where
    `intensity_limit` falls to the device's peak/bandwidth, L = 2·params·bandwidth / (peak·kv)."""
    return 2 * _positive("params", params) * _positive("bandwidth", bandwidth) / (
        _positive("peak_flops", peak_flops) * _positive("kv_bytes_per_token", kv_bytes_per_token))


def attention_intensity(num_heads: int, num_kv_heads: int, bytes_per_value: float) -> float:
    """FLOPs per byte of decode attention over the cache: per cached token and layer, QKᵀ and PV
    cost 4·heads·head_dim FLOPs and read 2·kv_heads·head_dim·b bytes of K and V, so
    2·heads / (kv_heads·b) — the GQA group size in 16-bit, whatever the batch or the context."""
    return 2 * _positive("num_heads", num_heads) / (_positive("num_kv_heads", num_kv_heads)
                                                    * _positive("bytes_per_value", bytes_per_value))


def llama_weights(num_layers: int, hidden_size: int, kv_width: int, intermediate_size: int) -> float:
    """Non-embedding weights of a Llama-style decoder: per layer Q and O (hidden²  each), K and V
    (hidden × kv_width each) and the gated MLP (3 × hidden × intermediate)."""
    layers, h = _positive("num_layers", num_layers), _positive("hidden_size", hidden_size)
    kv, inter = _positive("kv_width", kv_width), _positive("intermediate_size", intermediate_size)
    return layers * (h * (h + 2 * kv) + h * h + 3 * h * inter)


def recompute_attention_crossover(weights: float, num_layers: int, attention_width: float) -> float:
    """Tokens of context at which recomputing one token costs as much in attention as in matmuls.

    Recomputing a token costs 2·W FLOPs in the weight matmuls, plus attention over the c tokens
    before it: QKᵀ and PV, 2·2·L·(H·d)·c FLOPs (`attention_width` = H·d, the query heads' width).
    They are equal at c = W / (2·L·H·d). A preempted request of n tokens has on average n/2
    tokens before each of its tokens, so it reaches that balance at n = 2c."""
    return _positive("weights", weights) / (2 * _positive("num_layers", num_layers)
                                            * _positive("attention_width", attention_width))
