"""The state of one request as it moves through the engine (vLLM's `Sequence`, simplified).

A request's tokens are `token_ids` = prompt + generated so far. `num_computed_tokens` of them
have their keys and values in the KV cache; the rest must go through the model. So one rule
covers prefill, chunked prefill, decode and recompute after preemption: the next forward pass
computes tokens `num_computed_tokens .. num_tokens - 1`, and when it reaches the end, the logits
of the last one give the next token.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from inflight.engine.sampling import SamplingParams

__all__ = ["SequenceStatus", "Sequence", "check_stop", "append_token", "fail"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"    # queued: no KV blocks (new, or preempted by recompute)
    RUNNING = "running"    # holds KV blocks on the device, is in the batch
    SWAPPED = "swapped"    # preempted by swap: its KV blocks sit in the CPU pool
    FINISHED = "finished"  # done (stop, length, abort or error); blocks returned


class Sequence:
    """One request: its tokens, how many are in the KV cache, its block table, its clock."""

    __slots__ = ("request_id", "prompt_token_ids", "token_ids", "num_prompt_tokens", "params", "arrival_time",
                 "status", "num_computed_tokens", "num_scheduled_tokens", "block_table", "cpu_block_table",
                 "generator", "first_token_time", "token_times", "finish_time", "finish_reason", "seq_no",
                 "num_preemptions", "sort_key", "priority", "block_hashes", "num_cached_blocks",
                 "num_cached_tokens", "error", "first_scheduled_time", "detokenizer", "index", "group", "logprobs",
                 "prompt_logprobs", "cumulative_logprob", "spec_token_ids")

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: "SamplingParams", arrival_time: float,
                 seq_no: int = 0, generator: "torch.Generator | None" = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # grows by one per generated token
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.params = params
        self.arrival_time = arrival_time
        self.seq_no = seq_no  # submission order: breaks arrival-time ties deterministically
        self.priority = params.priority
        self.sort_key = (params.priority, arrival_time, seq_no)  # lower = served first (see engine.priority.priority_key)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0   # tokens whose K/V are in the cache
        self.num_scheduled_tokens = 0  # tokens this step's forward pass will compute
        self.block_table: list[int] = []
        self.cpu_block_table: list[int] = []  # where its KV waits while SWAPPED
        self.generator = generator
        self.first_scheduled_time: float | None = None  # when a step first admitted it (its queue time ends)
        self.first_token_time: float | None = None
        self.token_times: list[float] = []
        self.finish_time: float | None = None
        self.finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"; set when it ends
        self.error: str | None = None  # why it ended with "error"
        self.num_preemptions = 0
        # prefix caching: content keys of the full blocks of token_ids (they never change once the
        # tokens exist, so they survive preemption), how many of the blocks in block_table are known
        # to the cache, and how many prompt tokens the last admission took from the cache
        self.block_hashes: list[bytes] = []
        self.num_cached_blocks = 0
        self.num_cached_tokens = 0
        self.detokenizer = None  # its text so far and stop strings (engine.detokenizer), with a tokenizer
        # parallel sampling (engine.parallel_sampling): which sample of its request this is, and the
        # request's samples (None for n=1)
        self.index = 0
        self.group = None
        # log-probabilities, when asked for (engine.logprobs): one entry per generated token, their
        # sum, and one per prompt token (the first is None: nothing predicts it)
        self.logprobs: list | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.prompt_logprobs: list | None = [None] if params.prompt_logprobs is not None else None
        # speculative decoding (engine.spec_decode): this step's proposals, checked after its last token
        self.spec_token_ids: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """Generated tokens only."""
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens} "
                f"(prompt {self.num_prompt_tokens}), computed={self.num_computed_tokens}, "
                f"blocks={self.block_table})")


def check_stop(seq: Sequence, eos_token_ids: frozenset[int] | set[int], max_model_len: int) -> str | None:
    """Why `seq` must stop after its newest token — "stop" (EOS or a stop token) or "length" — or None."""
    last = seq.token_ids[-1]
    p = seq.params
    if (not p.ignore_eos and last in eos_token_ids) or last in p.stop_token_ids:
        return "stop"
    if seq.num_tokens - seq.num_prompt_tokens >= p.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None


def append_token(seq: Sequence, token: int, now: float, eos_token_ids: frozenset[int] | set[int],
                 max_model_len: int) -> None:
    """Append a sampled token to `seq` (with its time) and end `seq` if it must stop now. A stop
    check that raises ends `seq` alone, with the error (the last line of defence)."""
    seq.token_ids.append(token)
    seq.token_times.append(now)
    if seq.first_token_time is None:
        seq.first_token_time = now
    try:
        reason = check_stop(seq, eos_token_ids, max_model_len)
    except Exception as exc:  # noqa: BLE001 - one request's problem stays its own
        fail(seq, f"stop check failed ({type(exc).__name__}: {exc})", now)
    else:
        if reason is not None:
            seq.finish_reason = reason
            seq.finish_time = now


def fail(seq: Sequence, why: str, now: float) -> None:
    """End `seq` because something went wrong for it alone (finish_reason "error", with `why`): it
    leaves at the next reap like any finished request, and the others go on."""
    seq.finish_reason = "error"
    seq.error = why
    seq.finish_time = now
