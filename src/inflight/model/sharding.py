"""Tensor parallelism, the weights: which slice of each Hugging Face tensor a rank holds, read
from the checkpoint without reading the rest.

A rank builds a `LlamaModel` of its *local* config (`local_config`: its query heads, its KV heads,
its share of the MLP's columns; hidden size, vocabulary and layers unchanged) and fills it with
`shard_state_dict`, the HF-named tensors cut to its slices (`inflight.model.parallel` says why each
is cut where it is). `load_shard` reads those slices straight from the safetensors files
(`safe_open(...).get_slice`, memory-mapped), so each process reads about 1/N of the layers' bytes,
not the whole checkpoint — vLLM's `weight_loader`s do the same with `narrow`.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import torch

from inflight.model.llama import LlamaConfig, LlamaModel
from inflight.model.parallel import TPGroup, check_tp_size, head_range, kv_head_range, kv_heads_per_rank

__all__ = ["local_config", "check_config_tp", "shard_state_dict", "load_shard", "tensor_slice"]


def check_config_tp(config: LlamaConfig, tp_size: Any) -> int:
    """`tp_size` if `config` splits that many ways, else a ValueError naming what does not divide."""
    return check_tp_size(config.num_attention_heads, config.num_key_value_heads, config.intermediate_size, tp_size)


def local_config(config: LlamaConfig, tp_size: int) -> LlamaConfig:
    """One rank's config: `heads / N` query heads, `kv_heads_per_rank` KV heads, `intermediate / N`
    MLP columns; the head size stays (it is given explicitly, not re-derived from hidden / heads)."""
    check_config_tp(config, tp_size)
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // tp_size,
                               num_key_value_heads=kv_heads_per_rank(config.num_key_value_heads, tp_size),
                               intermediate_size=config.intermediate_size // tp_size, head_dim=config.head_dim)


def tensor_slice(name: str, config: LlamaConfig, rank: int, tp_size: int) -> tuple[str, Any]:
    """How rank `rank` cuts the HF tensor `name`: ("all", None) replicated; ("rows", (a, b)) rows
    a:b (column parallel); ("cols", (a, b)) columns a:b (row parallel); ("rank0", None) a
    row-parallel bias, held whole by rank 0 and as zeros by the others (so the all-reduce adds it once)."""
    d = config.head_dim
    if ".self_attn.q_proj." in name:
        h = head_range(config.num_attention_heads, rank, tp_size)
        return "rows", (h.start * d, h.stop * d)
    if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
        h = kv_head_range(config.num_key_value_heads, rank, tp_size)
        return "rows", (h.start * d, h.stop * d)
    if ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
        per = config.intermediate_size // tp_size
        return "rows", (rank * per, (rank + 1) * per)
    if ".self_attn.o_proj.weight" in name:
        h = head_range(config.num_attention_heads, rank, tp_size)
        return "cols", (h.start * d, h.stop * d)
    if ".mlp.down_proj.weight" in name:
        per = config.intermediate_size // tp_size
        return "cols", (rank * per, (rank + 1) * per)
    if ".self_attn.o_proj.bias" in name or ".mlp.down_proj.bias" in name:
        return "rank0", None
    return "all", None  # embeddings, LM head, norms


def _cut(name: str, config: LlamaConfig, rank: int, tp_size: int, read: Callable[[Any], torch.Tensor]) -> torch.Tensor:
    how, span = tensor_slice(name, config, rank, tp_size)
    if how == "rows":
        return read((slice(span[0], span[1]),))
    if how == "cols":
        return read((slice(None), slice(span[0], span[1])))
    whole = read(())
    return whole if how == "all" or rank == 0 else torch.zeros_like(whole)


def shard_state_dict(tensors: dict[str, torch.Tensor], config: LlamaConfig, rank: int, tp_size: int
                     ) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slices of the whole HF-named `tensors` (for tests and in-memory models)."""
    check_config_tp(config, tp_size)
    return {name: _cut(name, config, rank, tp_size, lambda idx, t=t: t[idx] if idx else t).contiguous()
            for name, t in tensors.items()}


def _read_slices(folder: Path, config: LlamaConfig, rank: int, tp_size: int) -> dict[str, torch.Tensor]:
    """Only this rank's slices, read from the memory-mapped safetensors files."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    files = ([folder / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
             if index.is_file() else sorted(folder.glob("*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                sl = st.get_slice(name)
                out[name] = _cut(name, config, rank, tp_size, lambda idx, sl=sl: sl[idx] if idx else sl[:]).contiguous()
    return out


def load_shard(path: str | Path, tp: TPGroup, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None) -> LlamaModel:
    """Rank `tp.rank`'s shard of the checkpoint at `path`, as a `LlamaModel` of its local config,
    all-reducing through `tp` (eval mode, no grad). dtype/device as `load_pretrained`."""
    from inflight.device import pick_device
    from inflight.model.loading import META_INIT_MIN_PARAMS, _default_dtype, _resolve, load_config

    folder = _resolve(path)
    full = load_config(folder)
    config = local_config(full, tp.size)
    dev = torch.device(pick_device(None if device is None else str(device)))
    raw = json.loads((folder / "config.json").read_text())
    dtype = dtype or _default_dtype(dev, raw.get("torch_dtype") or raw.get("dtype"))
    tensors = _read_slices(folder, full, tp.rank, tp.size)
    if sum(t.numel() for t in tensors.values()) > META_INIT_MIN_PARAMS:  # (as load_pretrained: no random init)
        with torch.device("meta"):
            model = LlamaModel(config, tp=tp)
        model = model.to_empty(device=dev)
    else:
        model = LlamaModel(config, tp=tp).to(dev)
    model = model.to(dtype)
    model.tie_weights()
    model.load_hf_state_dict(tensors)
    model.eval().requires_grad_(False)
    model.name_or_path = str(path)
    return model
