"""Prefill/decode disaggregation: a request's KV blocks moved from the engine that ran its prompt to
the engine that decodes it (vLLM's KV connector, `vllm/distributed/kv_transfer/kv_connector/v1/`,
reduced to its two halves).

- The **producer** side (the prefill instance) runs the prompt like any request, with
  `max_tokens=1`: that one forward pass gives the prompt's keys and values and the first token. An
  `LLMEngine(kv_connector=...)` asks its connector, when a request finishes, whether its KV is wanted
  (`wants_kv`); if so it gathers the request's KV out of its blocks — before the reap frees them —
  into a `KVPayload` (`extract_kv`) and hands it to the connector's `save`, which ships it.
- The **consumer** side (the decode instance) takes a payload with `LLMEngine.add_prefilled_request`:
  at its next step the engine allocates blocks for the prompt, writes the received keys and values
  into them (`insert_kv`), and the request joins the running batch as if it had just been
  prefilled there — its next step is a decode.

What travels per token is the KV of every layer: 2 × layers × KV heads × head size × bytes per value
(`inflight.model.kv_cache.kv_bytes_per_token`), the same figure that sizes the cache. A payload
is framed as a JSON header and the raw tensor bytes (`to_bytes` / `from_bytes`), so any byte
transport carries it: a socket here (`inflight.serve.disagg`); RDMA (NIXL), Mooncake's transfer
engine or NCCL in production.
"""
from __future__ import annotations

import json
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from inflight import checks
from inflight.engine.block_manager import blocks_needed
from inflight.engine.sequence import Sequence, SequenceStatus, append_token
from inflight.model.kv_cache import KVCache

__all__ = ["KVPayload", "KVConnector", "QueueConnector", "extract_kv", "insert_kv", "check_payload", "admit_prefilled",
           "ship_kv"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class KVPayload:
    """One request's prompt KV and what the decode side needs to carry on: `k[l]`, `v[l]` are layer
    l's keys and values for the `len(prompt_token_ids)` prompt tokens, `[tokens, kv_heads, head_dim]`;
    `output_token_ids` the tokens the prefill side sampled (the first one)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    meta: dict = field(default_factory=dict)  # timings and the like, carried along untouched

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def nbytes(self) -> int:
        """The KV bytes (what a transfer moves, less a header of some hundred bytes)."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def to_bytes(self) -> bytes:
        """A JSON header (length-prefixed) and the tensors' raw bytes, layer by layer, K then V."""
        dtype = str(self.k[0].dtype).removeprefix("torch.")
        head = json.dumps({"request_id": self.request_id, "prompt_token_ids": self.prompt_token_ids,
                           "output_token_ids": self.output_token_ids, "layers": len(self.k),
                           "shape": list(self.k[0].shape), "dtype": dtype, "meta": self.meta}).encode()
        body = b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for pair in zip(self.k, self.v)
                        for t in pair)
        return struct.pack("!I", len(head)) + head + body

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> "KVPayload":
        (n,) = struct.unpack_from("!I", data, 0)
        head = json.loads(bytes(data[4:4 + n]))
        dtype, shape = _DTYPES[head["dtype"]], head["shape"]
        per = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        expect = 4 + n + 2 * head["layers"] * per
        if len(data) != expect:
            raise ValueError(f"a KV payload of {len(data)} bytes, expected {expect} for {head['layers']} layers "
                             f"of {shape} {head['dtype']}")
        tensors, at = [], 4 + n
        for _ in range(2 * head["layers"]):
            raw = torch.frombuffer(bytearray(data[at:at + per]), dtype=torch.uint8)
            tensors.append(raw.view(dtype).view(shape))
            at += per
        return cls(head["request_id"], head["prompt_token_ids"], head["output_token_ids"], tensors[0::2],
                   tensors[1::2], head.get("meta", {}))


def _slots(block_table: list[int], num_tokens: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(num_tokens)
    return torch.tensor(block_table, dtype=torch.long)[pos // block_size] * block_size + pos % block_size


def extract_kv(kv: KVCache, block_table: list[int], num_tokens: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The keys and values of tokens 0..num_tokens-1 of the request whose blocks are `block_table`,
    per layer `[num_tokens, kv_heads, head_dim]`, copied to the CPU (the cache may be reused at once)."""
    slots = _slots(block_table, num_tokens, kv.block_size).to(kv.device)
    k = [layer.view(-1, kv.num_kv_heads, kv.head_dim)[slots].to("cpu") for layer in kv.k_cache]
    v = [layer.view(-1, kv.num_kv_heads, kv.head_dim)[slots].to("cpu") for layer in kv.v_cache]
    return k, v


def insert_kv(kv: KVCache, block_table: list[int], k: list[torch.Tensor], v: list[torch.Tensor]) -> None:
    """Write received keys and values (per layer `[tokens, kv_heads, head_dim]`) into the slots of
    `block_table`'s first tokens. The shapes must be this cache's: a payload from another model is refused."""
    if len(k) != kv.num_layers or len(v) != kv.num_layers:
        raise ValueError(f"a payload of {len(k)} layers for a cache of {kv.num_layers}")
    want = (kv.num_kv_heads, kv.head_dim)
    if any(tuple(t.shape[1:]) != want for t in (*k, *v)):
        raise ValueError(f"a payload of {tuple(k[0].shape[1:])} per token, the cache holds {want} (kv_heads, head_dim)")
    slots = _slots(block_table, k[0].shape[0], kv.block_size).to(kv.device)
    for layer in range(kv.num_layers):
        kv.k_cache[layer].view(-1, *want)[slots] = k[layer].to(kv.device, kv.dtype)
        kv.v_cache[layer].view(-1, *want)[slots] = v[layer].to(kv.device, kv.dtype)


class KVConnector:
    """The producer's side of a transfer (vLLM's `KVConnectorBase_V1.request_finished` and
    `save_kv_layer`, in one call): which finished requests' KV leave the engine, and where to."""

    def wants_kv(self, request_id: str) -> bool:
        """Whether the KV of this request (just finished) is to be shipped."""
        return False

    def save(self, payload: KVPayload) -> None:
        """Ship one request's KV (called on the engine's thread, before its blocks are freed)."""
        raise NotImplementedError


class QueueConnector(KVConnector):
    """Keeps the payloads of the requests named in `wanted` in `sent` (a list): the two halves in one
    process, for tests and the chapter."""

    def __init__(self, wanted: set[str] | None = None):
        self.wanted = wanted  # None: every request
        self.sent: list[KVPayload] = []

    def wants_kv(self, request_id: str) -> bool:
        return self.wanted is None or request_id in self.wanted

    def save(self, payload: KVPayload) -> None:
        self.sent.append(payload)


# -- the engine's two hooks (called by LLMEngine) ---------------------------------------------------
def check_payload(payload: Any, kv: KVCache, vocab_size: int, params: Any = None) -> None:
    """Refuse (TypeError/ValueError) a payload this engine cannot decode from: not a `KVPayload`,
    no first token, token ids outside the vocabulary, KV of another shape than this cache's; and
    parameters asking for several samples or prompt log-probabilities (the prompt ran elsewhere)."""
    if not isinstance(payload, KVPayload):
        raise TypeError(f"payload must be a KVPayload, got {type(payload).__name__}")
    if params is not None and (getattr(params, "n", 1) != 1 or getattr(params, "prompt_logprobs", None) is not None):
        raise ValueError("a prefilled request has one sample (n=1) and no prompt log-probabilities")
    if not payload.output_token_ids:
        raise ValueError("a prefilled request carries the token(s) sampled after its prompt: none here")
    checks.token_ids("output_token_ids", payload.output_token_ids, vocab_size)
    if len(payload.k) != kv.num_layers or len(payload.v) != kv.num_layers or any(
            tuple(t.shape) != (payload.num_tokens, kv.num_kv_heads, kv.head_dim) for t in (*payload.k, *payload.v)):
        raise ValueError(f"the payload's KV ({len(payload.k)} layers of {tuple(payload.k[0].shape) if payload.k else ()}) "
                         f"is not this model's for {payload.num_tokens} tokens")


def admit_prefilled(sched: Any, arrived: deque, kv: KVCache, eos_token_ids: frozenset[int],
                    max_model_len: int) -> list[Sequence]:
    """The decode side, at the start of a step: requests prefilled elsewhere (`arrived`: (request,
    payload) pairs, oldest first) get blocks, their KV written in, their sampled token(s) appended,
    and join the running batch — while blocks (with one spare each for its next token, so that it
    does not preempt at once) and batch slots allow. Returns the requests admitted."""
    now, admitted, alloc = time.perf_counter(), [], sched.allocator
    while arrived and len(sched.running) < sched.config.max_batch_size:
        seq, payload = arrived[0]
        need = blocks_needed(payload.num_tokens, alloc.block_size)
        if not alloc.can_allocate(need + 1):
            break
        arrived.popleft()
        seq.block_table = alloc.allocate(need)
        insert_kv(kv, seq.block_table, payload.k, payload.v)
        seq.num_computed_tokens = payload.num_tokens
        seq.first_scheduled_time = now
        seq.status = SequenceStatus.RUNNING
        for t in payload.output_token_ids:
            if seq.finish_reason is None:
                append_token(seq, t, now, eos_token_ids, max_model_len)
        sched.running.append(seq)
        admitted.append(seq)
    return admitted


def drop_arrived(arrived: deque, seq: Sequence) -> bool:
    """Abort a prefilled request that has no blocks yet: out of the queue, ended; False if not there."""
    for i, (waiting, _) in enumerate(arrived):
        if waiting is seq:
            del arrived[i]
            seq.finish_reason, seq.finish_time = "abort", time.perf_counter()
            return True
    return False


def ship_kv(connector: KVConnector, kv: KVCache, touched: list[Sequence]) -> None:
    """The prefill side, after a step: every request that just finished and that the connector wants
    leaves with its prompt's KV (gathered before the reap frees its blocks) and its sampled token(s)."""
    for s in touched:
        if s.finish_reason in ("length", "stop") and s.group is None and connector.wants_kv(s.request_id):
            k, v = extract_kv(kv, s.block_table, s.num_prompt_tokens)
            connector.save(KVPayload(s.request_id, list(s.prompt_token_ids), list(s.output_token_ids), k, v,
                                     {"first_token_time": s.first_token_time}))
