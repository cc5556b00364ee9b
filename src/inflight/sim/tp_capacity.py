"""Tensor parallelism as arithmetic: what one device holds and what a decode step costs at TP = N.

Chapter 10 argues with these formulas (its tables and its explorer); the tests pin them. Inputs
are a model's shape (`ModelShape`, named as in a Hugging Face config) and a device (`Device`: its
memory, memory bandwidth, and its links to the others), all plain numbers the chapter states.

- Memory per device: the layers' weights split N ways; the embedding and the LM head replicated
  (what `inflight.model.parallel` does; `vocab_split=True` prices vLLM's choice instead); the KV
  cache of the device's own KV heads (`inflight.model.tp_layout.kv_heads_per_rank`: replicated
  when there are fewer KV heads than devices). The KV pool is what is left of
  `utilization × memory` after the weights (vLLM's `gpu_memory_utilization`, activations ignored).
  Every device holds a slice of *every* token's KV, so the group holds as many tokens as one
  device's pool does — not N times as many.
- Time per decode step (a roofline, as chapter 1's): each device reads its weights and its slice of
  the batch's KV once, `bytes / bandwidth`, then pays two all-reduces per layer of the step's
  `[tokens, hidden]` activations: a ring all-reduce sends and receives `2 (N-1)/N` of the message
  per device, plus a fixed latency per call.

Torch-free (a chapter's site build and the tests use it anywhere).
"""
from __future__ import annotations

from dataclasses import dataclass

from inflight.model.tp_layout import check_tp_size, kv_heads_per_rank

__all__ = ["ModelShape", "Device", "LLAMA_70B", "LLAMA_8B", "H100_NVLINK", "H100_PCIE", "DeviceShare",
           "device_share", "all_reduce_bytes_per_token", "StepCost", "decode_step_cost", "GB"]

GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family model's shape (Hugging Face config names)."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: q, k, v, o, gate, up, down (norms left out: a few thousand)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        return attn + 3 * h * self.intermediate_size

    @property
    def vocab_params(self) -> int:
        """The embedding and the LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def params(self) -> int:
        return self.num_hidden_layers * self.layer_params + self.vocab_params


@dataclass(frozen=True)
class Device:
    """One accelerator and its links: memory (bytes), HBM bandwidth and per-direction link
    bandwidth (bytes/s), and the fixed latency of one all-reduce (seconds)."""

    name: str
    memory: float
    hbm_bandwidth: float
    link_bandwidth: float
    all_reduce_latency: float


#: Meta's Llama 3.1 70B (config.json on the hub) and 8B.
LLAMA_70B = ModelShape("Llama-3.1-70B", 80, 8192, 28672, 64, 8, 128, 128256)
LLAMA_8B = ModelShape("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256)
#: An H100 SXM (80 GB HBM3 at 3.35 TB/s) with NVLink 4 (900 GB/s both ways: 450 GB/s each way),
#: and the same card on PCIe 5.0 x16 (64 GB/s each way). The all-reduce latencies are this
#: chapter's assumptions (a few microseconds over NVLink, tens over PCIe), stated so that you can change them.
H100_NVLINK = Device("H100 SXM, NVLink", 80 * GB, 3.35e12, 450 * GB, 8e-6)
H100_PCIE = Device("H100, PCIe 5.0", 80 * GB, 3.35e12, 64 * GB, 25e-6)


@dataclass(frozen=True)
class DeviceShare:
    """What one of N devices holds (bytes), and the KV tokens its pool fits (0 if none)."""

    tp: int
    weights: float
    replicated: float          # of which: the embedding and LM head every device holds whole
    kv_heads: int              # KV heads on this device
    kv_bytes_per_token: float  # this device's slice of one token's KV
    kv_pool: float             # memory left for KV (negative: the weights do not even fit)
    kv_tokens: int

    @property
    def fits(self) -> bool:
        return self.kv_pool > 0


def device_share(model: ModelShape, tp: int, memory: float, *, dtype_bytes: int = 2, utilization: float = 0.9,
                 vocab_split: bool = False, kv_heads_fn=kv_heads_per_rank) -> DeviceShare:
    """One device's share of `model` at TP = `tp` (see the module docstring). `kv_heads_fn(kv, tp)`
    is the number of KV heads per device (the chapter's exercise can stand in for the package's)."""
    check_tp_size(model.num_attention_heads, model.num_key_value_heads, model.intermediate_size, tp)
    vocab = model.vocab_params / tp if vocab_split else model.vocab_params
    weights = (model.num_hidden_layers * model.layer_params / tp + vocab) * dtype_bytes
    heads = kv_heads_fn(model.num_key_value_heads, tp)
    per_token = 2 * model.num_hidden_layers * heads * model.head_dim * dtype_bytes
    pool = utilization * memory - weights
    return DeviceShare(tp, weights, vocab * dtype_bytes, heads, per_token, pool,
                       max(0, int(pool // per_token)) if pool > 0 else 0)


def all_reduce_bytes_per_token(model: ModelShape, dtype_bytes: int = 2) -> int:
    """Bytes all-reduced per token per forward pass: two `[hidden]` vectors per layer."""
    return 2 * model.num_hidden_layers * model.hidden_size * dtype_bytes


@dataclass(frozen=True)
class StepCost:
    """One decode step's time on each device (seconds): reading weights and KV, and all-reducing."""

    read: float
    communicate: float

    @property
    def total(self) -> float:
        return self.read + self.communicate


def decode_step_cost(model: ModelShape, device: Device, tp: int, batch: int, context: int, *,
                     dtype_bytes: int = 2) -> StepCost:
    """A decode step of `batch` requests with `context` tokens of KV each, at TP = `tp`: the
    memory-bound read of this device's weights and KV slice, then 2 × layers ring all-reduces of
    `batch × hidden` values (none at TP = 1)."""
    share = device_share(model, tp, device.memory, dtype_bytes=dtype_bytes)
    read = (share.weights + batch * context * share.kv_bytes_per_token) / device.hbm_bandwidth
    if tp == 1:
        return StepCost(read, 0.0)
    message = batch * model.hidden_size * dtype_bytes
    one = device.all_reduce_latency + 2 * (tp - 1) / tp * message / device.link_bandwidth
    return StepCost(read, 2 * model.num_hidden_layers * one)
