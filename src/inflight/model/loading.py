"""Load Hugging Face Llama-family checkpoints (config.json + safetensors) into `inflight.model.llama.LlamaModel`.

Supported: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM (sliding-window attention is not
implemented, so the context is capped at the window, where it is exact). A folder or a hub id
(downloaded with `huggingface_hub.snapshot_download`, e.g. on Colab). `load_tiny()` loads the model
this package ships, trained by `python -m inflight.model.train_tiny`.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from inflight.model.llama import LlamaConfig, LlamaModel
from inflight.model.tokenizer import ByteTokenizer, HFTokenizer

__all__ = ["load_pretrained", "load_tiny", "load_tokenizer", "load_config", "SUPPORTED_ARCHITECTURES", "TINY_PATH", "DRAFT_PATH"]

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
TINY_PATH = Path(__file__).resolve().parent / "assets"
#: the small draft model for speculative decoding with the tiny model (`train_tiny --draft`; chapter 12)
DRAFT_PATH = TINY_PATH / "draft"
_HUB_ID = re.compile(r"^[\w.\-]+/[\w.\-]+$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
META_INIT_MIN_PARAMS = 50_000_000  # above this, build the model on the meta device (no random init)


def _resolve(path_or_hub_id: str | Path) -> Path:
    """A local folder, or a hub id downloaded to the local cache (config, safetensors, tokenizer only)."""
    p = Path(path_or_hub_id).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        raise ValueError(f"{p} is a file; pass the checkpoint *folder* (with config.json and *.safetensors)")
    text = str(path_or_hub_id)
    if not _HUB_ID.match(text) or text.startswith((".", "/", "~")):
        raise FileNotFoundError(f"no checkpoint folder at {text!r} (and it is not a 'org/name' hub id)")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(text, allow_patterns=["*.json", "*.safetensors", "tokenizer.model", "*.txt"]))


def load_config(folder: str | Path) -> LlamaConfig:
    """The `LlamaConfig` of a checkpoint folder; unsupported architectures are a clear error."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json — not a Hugging Face checkpoint folder")
    raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r} in {path} (model_type {raw.get('model_type')!r}); "
                         f"inflight loads {', '.join(SUPPORTED_ARCHITECTURES)}")
    if arch == "Qwen2ForCausalLM":
        raw["model_type"] = "qwen2"
    window = raw.get("sliding_window")
    uses_window = window is not None and (arch == "MistralForCausalLM" or raw.get("use_sliding_window", False))
    if uses_window and window < raw.get("max_position_embeddings", 0):
        warnings.warn(f"{arch}: sliding-window attention is not implemented; capping the context at the "
                      f"window ({window} tokens), where full attention gives the same result", stacklevel=3)
        raw["max_position_embeddings"] = window
    try:
        return LlamaConfig.from_hf(raw)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: shard(s) listed in model.safetensors.index.json are missing: {missing}")
        files = [folder / s for s in shards]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        other = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt*")]
        hint = f" (found {other}: re-save with safe_serialization=True)" if other else ""
        raise FileNotFoundError(f"{folder} has no *.safetensors weights{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def _default_dtype(device: torch.device, raw_dtype: str | None) -> torch.dtype:
    if device.type != "cuda":
        return torch.float32  # half precision on CPU is slow and gains nothing here
    from inflight.device import half_dtype

    # bfloat16 checkpoints run in float16 where the GPU has no native bfloat16 (T4, V100), as vLLM does;
    # torch.cuda.is_bf16_supported() says True there (emulation), so ask for the compute capability
    fast = half_dtype(device)
    if raw_dtype == "float16" or fast == torch.float16:
        return torch.float16
    return torch.bfloat16


def load_pretrained(path_or_hub_id: str | Path, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None, with_tokenizer: bool = False):
    """A `LlamaModel` (eval mode, no grad) from a Hugging Face checkpoint folder or hub id.

    device: default CUDA when present; dtype: float32 on CPU, the checkpoint's half type on CUDA
    (float16 on GPUs without native bfloat16, such as the T4).
    With `with_tokenizer=True` returns `(model, tokenizer)`."""
    from inflight.device import pick_device

    folder = _resolve(path_or_hub_id)
    config = load_config(folder)
    tensors = _read_tensors(folder)
    dev = torch.device(pick_device(None if device is None else str(device)))
    raw = json.loads((folder / "config.json").read_text())
    dtype = dtype or _default_dtype(dev, raw.get("torch_dtype") or raw.get("dtype"))
    c = config
    approx = c.vocab_size * c.hidden_size * 2 + c.num_hidden_layers * (
        c.hidden_size * c.head_dim * (c.num_attention_heads * 2 + c.num_key_value_heads * 2)
        + 3 * c.hidden_size * c.intermediate_size)
    if approx > META_INIT_MIN_PARAMS:
        # big model: skip the random init of weights we overwrite anyway (the meta-device context
        # itself costs about a second to set up, so small models are simply built normally)
        with torch.device("meta"):
            model = LlamaModel(config)
        model = model.to_empty(device=dev)
    else:
        model = LlamaModel(config).to(dev)
    model = model.to(dtype)
    model.tie_weights()
    model.load_hf_state_dict(tensors)
    model.eval().requires_grad_(False)
    model.name_or_path = str(path_or_hub_id)
    if with_tokenizer:
        return model, load_tokenizer(folder)
    return model


def load_tokenizer(path_or_hub_id: str | Path):
    """The checkpoint's tokenizer: `ByteTokenizer` for the tiny model, else an `HFTokenizer` adapter."""
    folder = _resolve(path_or_hub_id)
    cfg_path = folder / "config.json"
    if cfg_path.is_file() and json.loads(cfg_path.read_text()).get("inflight_tokenizer") == "bytes":
        return ByteTokenizer()
    if any((folder / f).is_file() for f in _TOKENIZER_FILES):
        return HFTokenizer.from_pretrained(str(folder))
    raise FileNotFoundError(f"{folder} has no tokenizer files ({', '.join(_TOKENIZER_FILES)})")


def load_tiny(device: str | torch.device | None = "cpu", dtype: torch.dtype | None = None):
    """The shipped tiny model (byte-level, trained on stdlib functions) and its `ByteTokenizer`."""
    if not (TINY_PATH / "model.safetensors").is_file():
        raise FileNotFoundError(f"the tiny model is not in {TINY_PATH}; train it with `python -m inflight.model.train_tiny`")
    return load_pretrained(TINY_PATH, device=device, dtype=dtype), ByteTokenizer()
