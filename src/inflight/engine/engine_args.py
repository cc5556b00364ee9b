"""What `LLMEngine`'s constructor accepts, checked before anything is allocated: the tokenizer, the
device (the model's own), the stats window, the end-of-sequence ids, and a KV cache that either
fits the device or is refused with a clear error; and two small rules of its request API (request
ids, one SamplingParams per prompt)."""
from __future__ import annotations

from typing import Any

import torch

from inflight import checks
from inflight.engine.model_runner import KVSwapper
from inflight.engine.sampling import SamplingParams
from inflight.model.kv_cache import KVCache, kv_bytes_per_token

__all__ = ["check_tokenizer", "engine_device", "model_attr", "check_stats_window", "eos_token_ids",
           "allocate_kv_cache", "allocate_swapper", "allocate_pools", "id_key", "params_per_prompt"]


def eos_token_ids(config: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-sequence ids from the model's config and the tokenizer (either may name one)."""
    eos = set(getattr(config, "eos_token_ids", None) or [])
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        # a token id like any other (True is not token 1), and one of this model's
        eos.add(checks.integer("tokenizer.eos_token_id", tokenizer.eos_token_id, minimum=0,
                               maximum=config.vocab_size - 1))
    return frozenset(eos)


def model_attr(model: Any, attr: str, default: Any) -> Any:
    """The model's `device` or `dtype`: its own attribute when it has one (LlamaModel does), else
    its first parameter's, else `default` (a model without parameters, e.g. a stand-in in tests)."""
    value = getattr(model, attr, None)
    if isinstance(value, (torch.device, torch.dtype)):
        return value
    try:
        return getattr(next(model.parameters()), attr)
    except (AttributeError, StopIteration):
        return default


def check_tokenizer(tokenizer: Any) -> Any:
    """None, or something with `encode` and `decode` (checked now, not at the first string prompt)."""
    if tokenizer is not None and not (callable(getattr(tokenizer, "encode", None))
                                      and callable(getattr(tokenizer, "decode", None))):
        raise TypeError(f"tokenizer must have encode() and decode() methods, got {type(tokenizer).__name__}")
    return tokenizer


def engine_device(model: Any, device: Any) -> torch.device:
    """The device the engine runs on: the model's, or `device` if given (which must be the model's)."""
    own = model_attr(model, "device", None)
    if device is None:
        return own if own is not None else torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a device: {exc}") from None
    if own is not None and (own.type != device.type or None not in (own.index, device.index) and own.index != device.index):
        raise ValueError(f"the model is on {own} but device={str(device)!r}: move the model (model.to(...)) or leave "
                         "device out")
    return device


def check_stats_window(stats_window: Any) -> int | None:
    """How many recent steps `LLMEngine.stats` keeps: a positive int, or None for all of them."""
    return None if stats_window is None else checks.integer("stats_window", stats_window, minimum=1,
                                                            maximum=checks.INT64_MAX)


def allocate_kv_cache(config: Any, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> KVCache:
    """The KV cache; a pool too big for the device is a clear ValueError, not an allocator crash."""
    try:
        return KVCache.for_model(config, num_blocks, block_size, dtype=dtype, device=device)
    except (RuntimeError, MemoryError, OverflowError, AssertionError) as exc:  # out of memory, or a device torch can't use
        size = num_blocks * block_size * kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads,
                                                            config.head_dim, dtype)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"could not allocate a KV cache of {num_blocks} blocks of {block_size} tokens "
                         f"({size / 2**30:.2f} GiB) on {device}: {why}") from None


def allocate_pools(config: Any, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device,
                   use_graphs: bool, prefix_caching: bool, preemption: str, swap_blocks: int | None,
                   executor: Any = None) -> tuple:
    """The KV cache — on the workers with tensor parallelism (`executor`), else here, with one extra
    block past the allocator's pool for CUDA graphs' padding rows — the block allocator, and swap
    preemption's CPU pool and swapper (None, None without swap): (kv_cache, allocator, cpu_pool, swapper)."""
    from inflight.engine.block_manager import BlockAllocator
    from inflight.engine.model_runner import default_swap_blocks
    from inflight.engine.prefix_cache import PrefixCachingBlockAllocator

    if executor is not None:
        kv = executor.init_cache(num_blocks, block_size)
    else:
        kv = allocate_kv_cache(config, num_blocks + use_graphs, block_size, dtype, device)
    allocator = (PrefixCachingBlockAllocator if prefix_caching else BlockAllocator)(num_blocks, block_size)
    if preemption != "swap":
        return kv, allocator, None, None
    n_cpu = default_swap_blocks(kv) if swap_blocks is None else swap_blocks
    swapper = executor.init_swap(n_cpu, kv) if executor is not None else allocate_swapper(kv, n_cpu)
    return kv, allocator, BlockAllocator(n_cpu, block_size), swapper


def allocate_swapper(kv: KVCache, num_cpu_blocks: int) -> KVSwapper:
    """The CPU pool of swap preemption; one too big for the host is a clear ValueError too."""
    try:
        return KVSwapper(kv, num_cpu_blocks)
    except (RuntimeError, MemoryError, OverflowError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"could not allocate a CPU swap pool of {num_cpu_blocks} blocks "
                         f"({num_cpu_blocks * kv.bytes_per_block / 2**30:.2f} GiB): {why}; lower swap_blocks") from None


def id_key(request_id: Any) -> str:
    """Request ids are strings; an int is taken as its decimal string (so 5 and "5" are one id)."""
    if isinstance(request_id, str):
        return request_id
    try:  # an int as the package's checks define one: numpy's too, never a bool
        n = checks.integer("request_id", request_id)
    except TypeError:
        raise TypeError(f"request_id must be a str (or an int), got {type(request_id).__name__} "
                        f"({checks.show(request_id)})") from None
    try:
        return str(n)
    except ValueError:  # Python refuses to print ints over 4300 digits
        raise ValueError(f"request_id is {checks.show(n)}: too long to be an id; use a str") from None


def params_per_prompt(sampling_params: Any, n: int) -> list:
    """One SamplingParams (or None) per prompt: the one given, repeated, or a list of n."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    if not isinstance(sampling_params, (list, tuple)):
        raise TypeError("sampling_params must be a SamplingParams, None, or a list of them (one per prompt); "
                        f"got {type(sampling_params).__name__}")
    if len(sampling_params) != n:
        raise ValueError(f"{len(sampling_params)} sampling_params for {n} prompts: give one, or one per prompt")
    return list(sampling_params)
