"""inflight — a small, real LLM serving engine, built one chapter at a time.

The package has layers, lowest first: `model` (the decoder, attention, KV cache, loading),
`engine` (LLMEngine and its scheduler, block manager, sequences), `sim` (Part I's torch-free
schedulers and simulators), `bench` (`python -m inflight.bench`), `book` (plots, widgets, notebook
conventions) and `exercises` (the graders). `checks`, `stats`, `device` and `threads` are shared
helpers.

Names are imported lazily so that `import inflight` is instant and a chapter only pays for what
it uses (the scheduling chapters never import torch).
"""
from __future__ import annotations

from inflight._lazy import lazy_exports

# Before anything loads torch: idle OpenMP threads spin briefly, then sleep (OMP_WAIT_POLICY=PASSIVE with
# GOMP_SPINCOUNT=10000, unless you set either), so that a machine shared with other programs does not
# make torch's threads spin for milliseconds. Stdlib only.
from inflight import threads as _threads  # noqa: F401

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "StaticBatchScheduler": "sim.schedulers",
    "ContinuousBatchScheduler": "sim.schedulers",
    "SkipAheadScheduler": "sim.schedulers",
    "PriorityScheduler": "sim.schedulers",
    "BlockAllocator": "engine.block_manager",
    "NoFreeBlocksError": "engine.block_manager",
    "PrefixCachingBlockAllocator": "engine.prefix_cache",
    "LLMEngine": "engine.llm_engine",
    "RequestOutput": "engine.llm_engine",
    "EngineStalledError": "engine.liveness",
    "SamplingParams": "engine.sampling",
    "load_pretrained": "model.loading",
    "load_tiny": "model.loading",
    "LlamaConfig": "model.llama",
    "LlamaModel": "model.llama",
    "ByteTokenizer": "model.tokenizer",
    "describe_device": "device",
    "configure_threads": "threads",
    "machine_load": "threads",
}

__all__ = sorted(_EXPORTS) + ["__version__"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, also=["__version__"])
