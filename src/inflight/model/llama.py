"""A Llama-architecture decoder in plain torch, written for serving (nanoGPT in spirit).

RMSNorm, rotary position embeddings (Hugging Face's rotate-half convention), grouped-query
attention, a SwiGLU MLP, tied or untied embeddings, optional q/k/v bias (Qwen2). One forward pass
takes a *flattened ragged batch*: the new tokens of several requests concatenated, each with its
position, writing K/V into a `KVCache` and reading it back through `AttentionMetadata` — so prefill
chunks and decode tokens of different requests run in the same call.

Projections are fused (q|k|v in one matrix, gate|up in another) because on a small model every
saved kernel launch counts; `load_hf_state_dict` / `hf_state_dict` convert to and from Hugging Face's
separate tensors.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from inflight.model import fused_ops, layer_driver, skinny_gemm
from inflight.model.attention import AttentionBackend
from inflight.model.attention_metadata import AttentionMetadata
from inflight.model.kv_cache import KVCache
from inflight.model.parallel import ColumnParallelLinear, RowParallelLinear, TPGroup

__all__ = ["LlamaConfig", "LlamaModel", "RMSNorm"]


@dataclass
class LlamaConfig:
    """Hyperparameters, named as in Hugging Face's `LlamaConfig`."""

    vocab_size: int = 257
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None, or {"rope_type": "llama3" | "linear", ...}
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Llama: bias on q, k, v and o
    qkv_bias: bool | None = None  # Qwen2: bias on q, k, v only (None -> attention_bias)
    mlp_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    model_type: str = "llama"

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.qkv_bias is None:
            self.qkv_bias = self.attention_bias
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (Llama-family models use 'silu')")
        _rope_inv_freq(self)  # reject unsupported rope_scaling now, not at the first forward

    @property
    def eos_token_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else [e] if isinstance(e, int) else list(e)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "LlamaConfig":
        """From a Hugging Face config.json dict (transformers 4.x `rope_theta`/`rope_scaling` or 5.x `rope_parameters`)."""
        cfg = dict(cfg)
        rope = cfg.pop("rope_parameters", None) or {}
        scaling = cfg.get("rope_scaling") or None
        if "rope_theta" not in cfg and "rope_theta" in rope:
            cfg["rope_theta"] = rope["rope_theta"]
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if scaling is None and rope_type != "default":
            scaling = rope
        cfg["rope_scaling"] = scaling
        if cfg.get("model_type") == "qwen2":
            cfg.setdefault("qkv_bias", True)  # Qwen2 always has q/k/v bias and no o bias
            cfg["attention_bias"] = False
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in cfg.items() if k in names})

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers' LlamaForCausalLM reads."""
        d = asdict(self)
        d.pop("qkv_bias")
        d["architectures"] = ["LlamaForCausalLM"]
        d["torch_dtype"] = "float32"
        return d


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normalised x; with `residual`, (normalised residual + x, residual + x): the residual add
        and the norm in one pass (`fused_ops.rms_norm`)."""
        return fused_ops.rms_norm(x, self.weight, self.eps, residual)


def _rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    d = cfg.head_dim
    # explicit CPU device: the model may be built under `torch.device("meta")` by the loader
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device="cpu").float() / d))
    sc = cfg.rope_scaling
    if not sc:
        return inv_freq
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / sc["factor"]
    if kind == "llama3":  # Llama 3.1: stretch low frequencies, keep high ones, blend in between
        factor, low, high = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old_ctx = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        return torch.where(medium, blended, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3)")


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x) on the serving path: a step with a few rows takes the skinny-GEMM kernel (`skinny_gemm`).
    A row-parallel layer's partial result is then all-reduced (`inflight.model.parallel`)."""
    y = skinny_gemm.linear(x, layer.weight, layer.bias)
    return layer.reduce(y) if isinstance(layer, RowParallelLinear) else y


def _column(tp: TPGroup | None, in_f: int, out_f: int, bias: bool) -> nn.Linear:
    return nn.Linear(in_f, out_f, bias=bias) if tp is None else ColumnParallelLinear(in_f, out_f, bias, tp)


def _row(tp: TPGroup | None, in_f: int, out_f: int, bias: bool) -> nn.Linear:
    return nn.Linear(in_f, out_f, bias=bias) if tp is None else RowParallelLinear(in_f, out_f, bias, tp)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int, tp: TPGroup | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size, self.kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self.qkv_proj = _column(tp, cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.qkv_bias)
        self.o_proj = _row(tp, self.q_size, cfg.hidden_size, cfg.attention_bias)
        self.scale = self.head_dim ** -0.5

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q, k (rotated) and v of x `[..., hidden]`; cos/sin `[..., 1, head_dim]` broadcast over heads."""
        return fused_ops.split_and_rotate(self.qkv_proj(x), cos, sin, self.n_heads, self.n_kv, self.head_dim)

    def forward(self, x, cos, sin, meta: AttentionMetadata, kv_cache: KVCache, backend: AttentionBackend):
        """x `[T, hidden]` of a ragged batch: write this step's K/V to the cache, attend over the cache."""
        kc, vc = kv_cache.k_cache[self.layer_idx], kv_cache.v_cache[self.layer_idx]
        q = fused_ops.rotary_and_cache(_linear(self.qkv_proj, x), cos, sin, kc, vc, meta.slot_mapping, self.n_heads,
                                       self.n_kv)
        out = backend(q, kc, vc, meta, self.scale)
        return _linear(self.o_proj, out.flatten(-2))

    def forward_dense(self, x, cos, sin):
        """x `[B, L, hidden]`, causal, no cache: the training path."""
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, cos, sin))  # [B, heads, L, D]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                             enable_gqa=self.n_heads != self.n_kv)
        return self.o_proj(out.transpose(1, 2).flatten(-2))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp: TPGroup | None = None):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = _column(tp, cfg.hidden_size, 2 * cfg.intermediate_size, cfg.mlp_bias)
        self.down_proj = _row(tp, cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x):
        return _linear(self.down_proj, fused_ops.silu_and_mul(_linear(self.gate_up_proj, x)))  # SwiGLU


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer_idx: int, tp: TPGroup | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, x, residual, cos, sin, meta, kv_cache, backend):
        """The serving pass, with the residual stream kept apart as vLLM does: `x` is the previous
        layer's output and `residual` the running sum before it (None at the first layer), so each
        residual add happens inside the norm that follows it. Returns this layer's (output, residual)."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos, sin, meta, kv_cache, backend)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual

    def forward_dense(self, x, cos, sin):
        x = x + self.self_attn.forward_dense(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder plus its LM head. `forward` serves ragged batches over a KV cache;
    `forward_dense` is the plain causal pass used for training.

    With `tp` (tensor parallelism, `inflight.model.parallel`), this is one rank's shard: `config` is
    the *local* one (`inflight.model.sharding.local_config`: this rank's heads and MLP columns), o/down
    are row-parallel (an all-reduce each), and only rank 0 computes logits (the others return None)."""

    def __init__(self, config: LlamaConfig, tp: TPGroup | None = None):
        super().__init__()
        self.config = config
        self.tp = tp
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, tp) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        # a plain attribute, not a buffer: model.to(bfloat16) must not round the rotary frequencies
        self._inv_freq = _rope_inv_freq(config)
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # (`_rope_rows`)
        # which attention implementation runs ("auto": the Triton decode kernel on CUDA, else the
        # plain-torch reference); it records the one that ran last (`.last_used`)
        self.attention_backend = AttentionBackend("auto")

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config says so (again after `to_empty`)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin `[..., 1, head_dim]` of `positions` (broadcast over the heads)."""
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        if positions.device.type == "cpu" and positions.dim() == 1 and positions.numel() and \
                positions.dtype in (torch.int64, torch.int32):
            return self._rope_rows(positions, dtype)
        return self._rope_computed(positions, dtype)

    def _rope_computed(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float()[..., None] * self._inv_freq  # float32, as HF does
        emb = torch.cat((freqs, freqs), dim=-1)[..., None, :]  # [..., 1, head_dim]: broadcast over heads
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype):
        """The serving step's cos/sin on a CPU: rows of a table computed once for every position up
        to the largest seen (vLLM's `cos_sin_cache`), two lookups instead of six operators a step.
        The table's rows are `_rope_computed`'s to the bit (each entry is the same float32 operations
        on the same numbers). On a GPU the computation stays in the step: one kernel each, and no
        reading of the largest position back to the host (which a captured CUDA graph cannot do)."""
        low, high = (int(v) for v in torch.aminmax(positions))
        if low < 0:
            return self._rope_computed(positions, dtype)
        table = self._rope_table
        if table is None or table[0].shape[0] <= high or table[0].dtype != dtype:
            size = max(1024, 1 << high.bit_length())  # (doubling as longer contexts come: at most twice what is used)
            with torch.no_grad():
                cos, sin = self._rope_computed(torch.arange(size), dtype)
            self._rope_table = table = (cos[:, 0].contiguous(), sin[:, 0].contiguous())
        return (torch.index_select(table[0], 0, positions)[:, None, :],
                torch.index_select(table[1], 0, positions)[:, None, :])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache,
                logits_indices: torch.Tensor | None = None) -> torch.Tensor | None:
        """Flattened ragged batch `input_ids [T]`, `positions [T]` -> float32 logits of the rows in
        `logits_indices` (usually each sequence's last token) or of every token."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(f"input_ids and positions must both be 1-D [T]; got {tuple(input_ids.shape)} "
                             f"and {tuple(positions.shape)}")
        if input_ids.numel() != meta.num_tokens:
            raise ValueError(f"{input_ids.numel()} tokens but the metadata describes {meta.num_tokens}")
        if kv_cache.num_layers != len(self.layers):
            raise ValueError(f"KV cache has {kv_cache.num_layers} layers, model has {len(self.layers)}")
        # on a CPU, the whole step in one C call where each of its kernels would run in C anyway
        # (`layer_driver`: the same kernels, the same bits, without the Python between them)
        driven = layer_driver.run(self, input_ids, positions, meta, kv_cache, logits_indices)
        if driven is not None and driven is not layer_driver.REFUSED:  # (refused: op by op, which says why)
            logits, x, residual = driven
            if logits is not None:
                return logits
        else:
            x, residual = self.embed_tokens(input_ids), None
            cos, sin = self._rope(positions, x.dtype)  # once per step, shared by every layer
            for layer in self.layers:
                x, residual = layer(x, residual, cos, sin, meta, kv_cache, self.attention_backend)
        if self.tp is not None and self.tp.rank != 0:
            return None  # (the LM head is replicated: rank 0's logits are everybody's)
        if logits_indices is not None:  # the LM head only where a token will be sampled
            x, residual = x[logits_indices], residual[logits_indices]
        x, _ = self.norm(x, residual)
        return _linear(self.lm_head, x).float()

    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`input_ids [B, L]` -> logits `[B, L, vocab]`, causal, no KV cache (training / scoring)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self._rope(torch.arange(input_ids.shape[1], device=input_ids.device), x.dtype)
        for layer in self.layers:
            x = layer.forward_dense(x, cos, sin)
        return self.lm_head(self.norm(x))

    # --- Hugging Face weight names <-> our fused ones ---------------------------------------------
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights under Hugging Face Llama names (separate q/k/v and gate/up), ready for safetensors."""
        out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": self.embed_tokens.weight,
                                        "model.norm.weight": self.norm.weight}
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head.weight
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            a = layer.self_attn
            for suffix in ["weight", "bias"] if self.config.qkv_bias else ["weight"]:
                q, k, v = getattr(a.qkv_proj, suffix).split([a.q_size, a.kv_size, a.kv_size], dim=0)
                out.update({p + f"self_attn.q_proj.{suffix}": q, p + f"self_attn.k_proj.{suffix}": k,
                            p + f"self_attn.v_proj.{suffix}": v})
            out[p + "self_attn.o_proj.weight"] = a.o_proj.weight
            if self.config.attention_bias:
                out[p + "self_attn.o_proj.bias"] = a.o_proj.bias
            m = layer.mlp
            for suffix in ["weight", "bias"] if self.config.mlp_bias else ["weight"]:
                g, u = getattr(m.gate_up_proj, suffix).split(m.inter, dim=0)
                out[p + f"mlp.gate_proj.{suffix}"], out[p + f"mlp.up_proj.{suffix}"] = g, u
                out[p + f"mlp.down_proj.{suffix}"] = getattr(m.down_proj, suffix)
            out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
            out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        return {k: v.detach().contiguous() for k, v in out.items()}

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face-named weights in; a missing or misshapen tensor is an error naming it."""
        expected = {k: v.shape for k, v in self.hf_state_dict().items()}
        tensors = dict(tensors)
        if self.config.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)  # some tied checkpoints store it anyway
        elif "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
            raise ValueError("checkpoint has no lm_head.weight but config says tie_word_embeddings=false")
        missing = sorted(set(expected) - set(tensors))
        if missing:
            raise ValueError(f"checkpoint is missing {len(missing)} tensor(s), e.g. {missing[:5]}")
        unexpected = sorted(k for k in set(tensors) - set(expected) if not k.endswith("rotary_emb.inv_freq"))
        if unexpected:
            raise ValueError(f"checkpoint has {len(unexpected)} tensor(s) this architecture does not use, "
                             f"e.g. {unexpected[:5]}")
        for name, shape in expected.items():
            if tuple(tensors[name].shape) != tuple(shape):
                raise ValueError(f"shape mismatch for {name}: checkpoint has {tuple(tensors[name].shape)}, "
                                 f"config implies {tuple(shape)}")
        t = tensors
        with torch.no_grad():
            self.embed_tokens.weight.copy_(t["model.embed_tokens.weight"])
            self.norm.weight.copy_(t["model.norm.weight"])
            if not self.config.tie_word_embeddings:
                self.lm_head.weight.copy_(t["lm_head.weight"])
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                a = layer.self_attn
                for suffix in ["weight", "bias"] if self.config.qkv_bias else ["weight"]:
                    getattr(a.qkv_proj, suffix).copy_(torch.cat(
                        [t[p + f"self_attn.{n}_proj.{suffix}"] for n in "qkv"], dim=0))
                a.o_proj.weight.copy_(t[p + "self_attn.o_proj.weight"])
                if self.config.attention_bias:
                    a.o_proj.bias.copy_(t[p + "self_attn.o_proj.bias"])
                m = layer.mlp
                for suffix in ["weight", "bias"] if self.config.mlp_bias else ["weight"]:
                    getattr(m.gate_up_proj, suffix).copy_(torch.cat(
                        [t[p + f"mlp.gate_proj.{suffix}"], t[p + f"mlp.up_proj.{suffix}"]], dim=0))
                    getattr(m.down_proj, suffix).copy_(t[p + f"mlp.down_proj.{suffix}"])
                layer.input_layernorm.weight.copy_(t[p + "input_layernorm.weight"])
                layer.post_attention_layernorm.weight.copy_(t[p + "post_attention_layernorm.weight"])
