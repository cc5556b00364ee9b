"""All of a serving step's decoder layers in one C call, on a CPU.

Each of a layer's nine operations already runs in C (`fused_ops`, `skinny_gemm`, `cpu_attention`),
but called one at a time from Python each also pays its wrapper: checks, a new output tensor, a
dozen pointers fetched and converted by ctypes. At a decode step's size that is 10-40 us a call, as
much as many of the kernels themselves, nine times a layer. `csrc/decoder_layers.c` calls the same
compiled kernels in the same order with the same arguments, on buffers carved once per step: the
results are the op-by-op path's to the bit (tested), and the Python between the kernels is gone.
(A GPU gets the same saving from a captured CUDA graph, `inflight.engine.cuda_graphs`.)

`run` takes a step only where every kernel of it would run in C anyway: float32 on the CPU, no
gradient, no tensor parallelism (a row-parallel layer all-reduces in Python), at most
`skinny_gemm.max_rows()` tokens (more go to torch's GEMM), attention the C kernel's for the whole
step, and no torch profiler running (so a profile still shows each kernel under its own name).
Anything else -- or `INFLIGHT_LAYER_DRIVER=0`, or inside `op_by_op()` -- runs the layers op by op.
"""
from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from inflight import checks
from inflight.model import attention, c_build, cpu_attention, fused_ops, skinny_gemm, thread_pool

__all__ = ["run", "load", "build_error", "op_by_op", "clock_into", "REFUSED", "PROFILER_NAME"]

SOURCE = Path(__file__).with_name("csrc") / "decoder_layers.c"
FLAGS = ["-O2", "-shared", "-fPIC", "-std=gnu99"]
SYMBOLS = ("inflight_decoder_layers_f32",)
PROFILER_NAME = "inflight::decoder_layers_c"
OFF_VAR = "INFLIGHT_LAYER_DRIVER"
#: what `run` answers when a kernel refused the step part-way (a slot or a block table outside the
#: cache): the embeddings it was given have been written to; the caller starts again op by op, where
#: the same refusal becomes the error (or the fallback) it always was
REFUSED = object()

_p = ctypes.c_void_p
_i64 = ctypes.c_int64


class _Layer(ctypes.Structure):
    _fields_ = [(name, _p) for name in ("input_norm", "qkv", "qkv_bias", "o", "o_bias", "post_norm", "gate_up",
                                         "gate_up_bias", "down", "down_bias", "k_cache", "v_cache")]


class _Step(ctypes.Structure):
    _fields_ = [("ids", _p), ("positions", _p), ("embed", _p), ("rope_cos", _p), ("rope_sin", _p), ("vocab_rows", _i64),
                ("rope_rows", _i64), ("gemm", _p), ("norm", _p), ("silu", _p), ("rotary", _p), ("attention", _p), ("layers", _p),
                ("num_layers", _i64), ("T", _i64), ("hidden", _i64), ("H", _i64), ("KV", _i64), ("D", _i64),
                ("inter", _i64), ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("cos", _p), ("sin", _p),
                ("slot_mapping", _p), ("num_blocks", _i64), ("block_size", _i64), ("block_tables", _p),
                ("max_blocks", _i64), ("context_lens", _p), ("workspace", _p), ("workspace_per_thread", _i64),
                ("threads", ctypes.c_int), ("x", _p), ("y", _p), ("h", _p), ("qkv_out", _p), ("q", _p), ("attn", _p),
                ("gate_up_out", _p), ("act", _p), ("seconds", _p), ("failed_layer", _i64), ("final_norm", _p),
                ("lm_head", _p), ("lm_bias", _p), ("vocab", _i64), ("R", _i64), ("rows", _p), ("tail_y", _p),
                ("tail_x", _p), ("tail_h", _p), ("logits", _p)]


def _declare(lib: ctypes.CDLL) -> None:
    lib.inflight_decoder_layers_f32.argtypes = [ctypes.POINTER(_Step)]
    lib.inflight_decoder_layers_f32.restype = ctypes.c_int


_library = c_build.LazyLibrary(SOURCE, FLAGS, SYMBOLS, _declare, openmp=False)
_state: dict[str, Any] = {"off": 0, "clocks": []}


def load() -> ctypes.CDLL | None:
    """The compiled driver (built on first use, cached per machine by `c_build`), or None."""
    return _library.load()


def build_error() -> str | None:
    """Why `load()` returned None (None if it hasn't been tried or it worked)."""
    return _library.build_error()


@contextmanager
def op_by_op():
    """Inside this block the layers run one operation at a time (the definition the driver must
    match, and what tests compare it with)."""
    _state["off"] += 1
    try:
        yield
    finally:
        _state["off"] -= 1


def clock_into(seconds: dict, calls: dict):
    """From now on each driven step adds its kernels' time to `seconds` ("linear layers", the
    attention of a decode-only step or of a step with prompt tokens, "norms, rotary + KV write,
    SwiGLU": `bench.offline.time_split`'s seams) and counts the calls in `calls`; returns the undo."""
    entry = (seconds, calls)
    _state["clocks"].append(entry)
    return lambda: _state["clocks"].remove(entry)


def _entry(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _kernels() -> tuple[int, int, int, int, int] | None:
    """The five kernels' entry points (gemm, norm, silu, rotary, attention), or None where one of
    their libraries isn't loaded (asked every step, as the op-by-op path asks at every call)."""
    libs = (skinny_gemm.load(), fused_ops.load(), cpu_attention.load())
    if None in libs:
        return None
    held = _state.get("kernels")
    if held is None or held[0] != tuple(map(id, libs)):
        gemm, ops, attn = libs
        found = (_entry(gemm, "inflight_packed_gemm_f32"), _entry(ops, "inflight_rms_norm_f32"),
                 _entry(ops, "inflight_silu_and_mul_f32"), _entry(ops, "inflight_rotary_and_cache_f32"),
                 _entry(attn, "inflight_paged_decode_f32"))
        _state["kernels"] = held = (tuple(map(id, libs)), libs, found)  # (the libraries kept alive with them)
    return held[2]


def _turned_off() -> bool:
    return checks.switched_off(OFF_VAR)


#: each layer's weights in the driver's order: (the submodule's path, the parameter's name)
_WEIGHTS = (("input_layernorm",), "weight"), (("self_attn", "qkv_proj"), "weight"), (("self_attn", "qkv_proj"), "bias"), \
    (("self_attn", "o_proj"), "weight"), (("self_attn", "o_proj"), "bias"), (("post_attention_layernorm",), "weight"), \
    (("mlp", "gate_up_proj"), "weight"), (("mlp", "gate_up_proj"), "bias"), (("mlp", "down_proj"), "weight"), \
    (("mlp", "down_proj"), "bias")


def _weights(model: Any) -> list[torch.Tensor | None]:
    """Every layer's weights, looked up afresh (a replaced module or weight is seen at the next step)
    through the modules' own dictionaries: nn.Module's attribute lookup would cost more than the rest
    of the driver's Python together."""
    out: list[torch.Tensor | None] = []
    for layer in model._modules["layers"]._modules.values():
        for path, name in _WEIGHTS:
            m = layer
            for part in path:
                m = m._modules[part]
            out.append(m._parameters.get(name))
    head = model._modules["lm_head"]._parameters
    return out + [model._modules["embed_tokens"]._parameters["weight"], model._modules["norm"]._parameters["weight"],
                  head["weight"], head.get("bias")]


def _layer_table(model: Any, kv_cache: Any) -> tuple[ctypes.Array, torch.Tensor] | None:
    """The per-layer pointer table and the LM head's packed weights, kept on the model while its
    weights and the cache are the same tensors with the same contents (a weight changed in place is
    packed again); None where a weight is not a contiguous float32 CPU tensor."""
    weights = _weights(model)
    try:
        key = [None if w is None else (id(w), w.data_ptr(), w._version) for w in weights]
    except RuntimeError:  # an inference tensor keeps no version counter (skinny_gemm._version)
        key = [None if w is None else (id(w), w.data_ptr(), skinny_gemm._version(w)) for w in weights]
    key.extend(c.data_ptr() for c in kv_cache.k_cache + kv_cache.v_cache)
    held = getattr(model, "_layer_driver_table", None)
    if held is not None and held[0] == key:
        return held[1]
    if any(w is not None and (w.dtype is not torch.float32 or not w.is_cpu or not w.is_contiguous()) for w in weights):
        return None  # (a new tensor, or new storage, changes the key: this is asked again then)
    table = (_Layer * len(model.layers))()
    keep = []  # the packed panels the table points into
    for i in range(len(model.layers)):
        w = weights[10 * i:10 * i + 10]
        packed = [skinny_gemm.panels(w[j]) for j in (1, 3, 6, 8)]
        keep += packed
        ptr = [t.data_ptr() if t is not None else None for t in
               (w[0], packed[0], w[2], packed[1], w[4], w[5], packed[2], w[7], packed[3], w[9])]
        table[i] = _Layer(*ptr, kv_cache.k_cache[i].data_ptr(), kv_cache.v_cache[i].data_ptr())
    model._layer_driver_table = (key, (table, skinny_gemm.panels(weights[-2])), keep)
    return model._layer_driver_table[1]


def _attention_batch(model: Any, meta: Any):
    """The block tables and context lengths the C attention kernel would get for this step, or None
    where the op-by-op path would not give the whole step to it."""
    backend = model.attention_backend
    if backend.kernel_error is not None:
        return None
    if meta.is_decode:
        return meta.block_tables, meta.context_lens
    if backend.name == "auto" and meta.max_context_len <= attention.C_PREFILL_MAX_CONTEXT:
        tok = meta.token_batch
        return tok.block_tables, tok.context_lens
    return None


def _align(n: int) -> int:
    return (n + 15) // 16 * 16  # every buffer starts on a 64-byte line


def _rope_table(model: Any, positions: torch.Tensor, meta: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The model's float32 rotary tables (`LlamaModel._rope_rows`), made or grown to cover the
    step's contexts; None where there are none (the C checks every position against them)."""
    table = model._rope_table
    if table is None or table[0].shape[0] < meta.max_context_len or table[0].dtype is not torch.float32:
        model._rope(positions, torch.float32)
        table = model._rope_table
    return table if table is not None and table[0].dtype is torch.float32 else None


def _plan(model: Any, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any, kv_cache: Any):
    """(kernels, driver, layer table, rotary tables, attention's block tables and lengths) where the
    driver may take this step -- where each of its kernels would run in C op by op -- else None.
    (Plain attribute checks: a torch operator here would cost more than the rest of the step's Python.)"""
    if _state["off"] or model.tp is not None or torch.is_grad_enabled() or \
            torch.autograd.profiler._is_profiler_enabled or model.attention_backend.name not in ("auto", "c"):
        return None
    T, cfg = input_ids.shape[0], model.config
    H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    kc, vc = kv_cache.k_cache[0], kv_cache.v_cache[0]
    if not (T >= 1 and input_ids.dtype is torch.int64 and positions.dtype is torch.int64
            and input_ids.is_cpu and positions.is_cpu and input_ids.is_contiguous() and positions.is_contiguous()
            and positions.shape == input_ids.shape and D % 2 == 0 and H % KV == 0 and H // KV <= 64
            and kc.dim() == 4 and tuple(kc.shape[2:]) == (KV, D) and vc.shape == kc.shape
            and fused_ops._fusable(kc, vc)  # (float32 CPU caches; what the op-by-op layer asks of its passes)
            and T <= skinny_gemm.max_rows()):
        return None
    batch = _attention_batch(model, meta)
    if batch is None or _turned_off():
        return None
    kernels, lib = _kernels(), load()
    table = _layer_table(model, kv_cache) if kernels is not None and lib is not None else None
    rope = _rope_table(model, positions, meta) if table is not None else None
    if rope is None:
        return None
    tables, lens = batch
    slots = meta.slot_mapping
    if not (tables.dtype is torch.int32 and lens.dtype is torch.int32 and slots.dtype is torch.int64 and
            tables.is_contiguous() and lens.is_contiguous() and slots.is_contiguous() and tables.shape[0] == T and
            lens.shape == (T,) and slots.shape == (T,) and tables.is_cpu and slots.is_cpu):
        return None
    if any(not (c.is_contiguous() and c.dtype is torch.float32) for c in kv_cache.k_cache + kv_cache.v_cache):
        return None
    return kernels, lib, table, rope, tables, lens


def _scratch(model: Any, floats: int) -> torch.Tensor:
    """This thread's scratch buffer for `model`'s steps, kept between steps and grown to the largest
    (what the driver writes there never leaves a step: the logits get a tensor of their own)."""
    local = model.__dict__.get("_layer_driver_scratch")
    if local is None:
        local = model.__dict__["_layer_driver_scratch"] = threading.local()
    buf = getattr(local, "buf", None)
    if buf is None or buf.numel() < floats:
        local.buf = buf = torch.empty(max(floats, 0 if buf is None else 2 * buf.numel()), dtype=torch.float32)
    return buf


def _tail_rows(model: Any, T: int, logits_indices: torch.Tensor | None) -> int | None:
    """How many rows of logits the driver computes itself (the final norm and the LM head), or None
    where they stay in Python: more rows than the C GEMM takes (torch's would give other bits)."""
    if logits_indices is None:
        R = T
    elif logits_indices.dtype is torch.int64 and logits_indices.dim() == 1 and logits_indices.is_cpu and \
            logits_indices.is_contiguous():
        R = logits_indices.shape[0]
    else:
        return None
    head = model.lm_head
    return R if 1 <= R <= skinny_gemm.max_rows() and head.bias is None else None


def run(model: Any, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any, kv_cache: Any,
        logits_indices: torch.Tensor | None = None):
    """`model`'s step from token ids to logits: (float32 logits of `logits_indices`' rows -- or of
    every row --, None, None), or (None, the last layer's output, the residual stream's running sum)
    where the final norm and LM head are left to the caller (who must use them before the next step:
    they live in scratch), as the op-by-op path computes them; None where the driver does not take
    the step (nothing was touched), or `REFUSED` (see there)."""
    plan = _plan(model, input_ids, positions, meta, kv_cache)
    if plan is None:
        return None
    (gemm, norm, silu, rotary, attn), lib, (table, lm_panels), (rope_cos, rope_sin), tables, lens = plan
    cfg, T = model.config, input_ids.shape[0]
    H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    hidden, inter, width = cfg.hidden_size, cfg.intermediate_size, (H + 2 * KV) * D
    num_blocks, block_size = kv_cache.k_cache[0].shape[:2]
    threads = max(1, thread_pool.threads())
    R = _tail_rows(model, T, logits_indices)
    embed, vocab = model.embed_tokens.weight, model.lm_head.weight.shape[0]
    # the attention kernel's workspace per thread: a lone query's scores and sums of weights, or a tile's
    per_thread = cpu_attention.workspace_per_thread(H, D, meta.max_context_len, tables.shape[1] * block_size)
    # y, x, h, qkv, q, attention's output, gate|up, SwiGLU's output, workspace, cos, sin; the tail's rows
    sizes = [T * hidden, T * hidden, T * hidden, T * width, T * H * D, T * H * D, T * 2 * inter, T * inter,
             threads * per_thread, T * D, T * D] + ([0, 0, 0] if R is None else [R * hidden] * 3)
    buf = _scratch(model, sum(_align(n) for n in sizes))
    ptrs, at = [], buf.data_ptr()
    for n in sizes:
        ptrs.append(at)
        at += 4 * _align(n)
    logits = None if R is None else torch.empty(R, vocab, dtype=torch.float32)
    clocks = _state["clocks"]
    seconds = (ctypes.c_double * 3)() if clocks else None
    tail = (None, None, None, 0, 0, None, None, None, None, None) if R is None else (
        model.norm.weight.data_ptr(), lm_panels.data_ptr(), None, vocab, R,
        None if logits_indices is None else logits_indices.data_ptr(), *ptrs[11:14], logits.data_ptr())
    step = _Step(input_ids.data_ptr(), positions.data_ptr(), embed.data_ptr(), rope_cos.data_ptr(),
                 rope_sin.data_ptr(), embed.shape[0], rope_cos.shape[0], gemm, norm, silu, rotary, attn,
                 ctypes.addressof(table), len(model.layers), T, hidden, H, KV, D, inter, cfg.rms_norm_eps,
                 model.layers[0].self_attn.scale, ptrs[9], ptrs[10], meta.slot_mapping.data_ptr(), num_blocks,
                 block_size, tables.data_ptr(), tables.shape[1], lens.data_ptr(), ptrs[8], per_thread, threads,
                 ptrs[1], ptrs[0], *ptrs[2:8], None if seconds is None else ctypes.addressof(seconds), -1, *tail)
    rc = lib.inflight_decoder_layers_f32(ctypes.byref(step))
    if seconds is not None:
        _clock(seconds, meta, len(model.layers), R is not None)
    if rc != 0:
        return REFUSED
    model.attention_backend.last_used = "c"
    if logits is not None:
        return logits, None, None
    return None, buf[:T * hidden].view(T, hidden), buf[_align(T * hidden):_align(T * hidden) + T * hidden].view(T, hidden)


def _clock(seconds: ctypes.Array, meta: Any, layers: int, with_tail: bool) -> None:
    """A driven step's kernel time into the time splits that asked for it (`clock_into`)."""
    kind = "attention, decode-only steps" if meta.is_decode else "attention, steps with prompt tokens"
    for into, calls in _state["clocks"]:
        for name, sec, count in (("linear layers", seconds[0], 4 * layers + with_tail), (kind, seconds[1], layers),
                                 ("norms, rotary + KV write, SwiGLU", seconds[2], 4 * layers + with_tail)):
            into[name] += sec
            calls[name] += count
