"""Which model a benchmark serves: a checkpoint (`--model`), a named shape with random weights
(`--model smollm2-135m-shape`), the shipped tiny model, or a random Llama of the tiny model's shape
when neither is at hand (a development checkout)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["BenchModel", "SHAPES", "random_model", "shaped_model", "load_model", "describe_model", "save_model",
           "load_saved"]


@dataclass
class BenchModel:
    """A loaded model and what the results record about where it came from."""

    model: Any
    source: str
    weights_sha256: str | None = None


def random_model(seed: int = 0, vocab_size: int = 257, device: str | None = None) -> Any:
    """A random Llama of the tiny model's shape (4 layers, 256 wide, 2 KV heads): the stand-in when no trained model is at hand."""
    from inflight.model.llama import LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaModel(cfg).eval().to(device or "cpu")


#: Named shapes served with random weights (offline GPU machines have no hub access; speed depends
#: on the shape, not on the values). SmolLM2-135M's config.json: 30 layers, hidden 576, 9 heads of
#: 64 with 3 KV heads, SwiGLU 1536, vocabulary 49152, tied embeddings, rope theta 100000, 8192 positions.
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m-shape": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                               num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
                               max_position_embeddings=8192, tie_word_embeddings=True),
}


def shaped_model(name: str, seed: int = 0, device: Any = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """A random-weight Llama of a named shape in `SHAPES`."""
    from inflight.model.llama import LlamaConfig, LlamaModel

    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {sorted(SHAPES)}")
    torch.manual_seed(seed)
    return LlamaModel(LlamaConfig(**SHAPES[name])).eval().to(device, dtype)


def load_model(name: str | None, device: str | None = None, dtype: str | None = None, seed: int = 0) -> BenchModel:
    """`name` (a checkpoint folder or hub id) via `load_pretrained`, else the shipped tiny model, else
    a random one. float32 unless `dtype` says otherwise: every mode must produce the same greedy
    tokens, and in bf16/fp16 a different batch composition changes the rounding and with it some
    tokens (seen on an H200: 3-20 of 64 continuations differed and every batched mode was refused)."""
    from inflight.device import pick_device

    dev = pick_device(device)
    dt = getattr(torch, dtype) if dtype else torch.float32
    if name in SHAPES:
        return BenchModel(shaped_model(name, seed, dev, dt), f"random weights, {name}")
    if name:
        from inflight.model.loading import load_pretrained

        return BenchModel(load_pretrained(name, device=dev, dtype=dt).eval(), name)
    try:
        from inflight.model.loading import TINY_PATH, load_tiny

        model, _tok = load_tiny()
        return BenchModel(model.to(dev, dt).eval(), "inflight tiny model (load_tiny)",
                          _sha256(TINY_PATH / "model.safetensors"))
    except Exception as exc:  # the shipped model may not exist yet on a development checkout
        return BenchModel(random_model(seed, device=dev), f"random 4-layer 256-wide Llama (load_tiny failed: {exc})")


def describe_model(model: Any) -> str:
    """A one-line description of a model passed in rather than loaded here: its shape (not its
    `name_or_path`, a local folder that would end up on the book's pages)."""
    cfg = model.config
    return f"{type(model).__name__} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size})"


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def save_model(model: Any, path: str) -> str:
    """Write a model for the contenders' processes to load (`--weights`): a model held only in
    memory -- a notebook's, a test's random one -- can be compared too."""
    import dataclasses

    torch.save({"config": dataclasses.asdict(model.config), "state_dict": model.state_dict()}, path)
    return path


def load_saved(path: str) -> Any:
    """The model `save_model` wrote, in float32 for inference."""
    from inflight.model.llama import LlamaConfig, LlamaModel

    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = LlamaModel(LlamaConfig(**saved["config"]))
    model.load_state_dict(saved["state_dict"])
    return model.float().eval()
