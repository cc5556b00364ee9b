"""inflight — a small, real LLM serving engine, built one chapter at a time.

Names are imported lazily so that `import inflight` is instant and a chapter only pays for what
it uses (the scheduling chapters never import torch).
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "StaticBatchScheduler": "schedulers",
    "ContinuousBatchScheduler": "schedulers",
    "BlockAllocator": "blocks",
    "NoFreeBlocksError": "blocks",
    "PrefixCachingBlockAllocator": "prefix_cache",
    "PriorityScheduler": "fairness",
    "SkipAheadScheduler": "schedulers",
    "load_pretrained": "loading",
    "load_tiny": "loading",
    "LlamaConfig": "model",
    "LlamaModel": "model",
    "ByteTokenizer": "tokenizer",
    "LLMEngine": "engine",
    "SamplingParams": "engine",
    "RequestOutput": "engine",
    "describe_device": "device",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inflight' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
