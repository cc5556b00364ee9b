"""Log-probabilities in the engine: which logits rows a step needs, and where the answers go.

Generated tokens (`SamplingParams.logprobs = k`): the sampler's own rows — the logits each token
was drawn from, before temperature and top-p (`inflight.model.logprobs`) — give the token's
log-probability, its rank and the top `k`. One entry per generated token, appended with the token.

Prompt tokens (`SamplingParams.prompt_logprobs = k`, vLLM's name): the logits at prompt position
`j` predict token `j + 1`, so the prompt's log-probabilities need the LM head at every prompt
position, not only the last. A step that computes positions `c .. c + q - 1` of a prompt (its
whole prompt, or one chunk of it under chunked prefill) asks the model for those rows too
(`prompt_rows`), and they give the entries of tokens `c + 1 .. c + q` that are prompt tokens.
Entry 0 is None (nothing predicts the first token). A request is preempted and recomputed? Its
entries are already there and are not taken again. The prefix cache? A cached prefix is never
computed, so it has no logits: a request that still needs its prompt's log-probabilities does not
start from the cache (vLLM does the same), though the blocks it computes are cached for others.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inflight.engine.outputs import Logprob

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.sequence import Sequence
    from inflight.model.logprobs import RowLogprobs

__all__ = ["StepLogprobs", "wants_prompt_logprobs", "prompt_rows", "entry", "record_sampled", "record_prompt",
           "fill_decoded"]


@dataclass
class StepLogprobs:
    """What one step computed for the requests that asked: `sampled[k]` for the k-th token drawn
    (in draw order), and `prompt` as (request, first prompt token index, entries)."""

    sampled: dict[int, "RowLogprobs"] = field(default_factory=dict)
    prompt: list[tuple["Sequence", int, list["RowLogprobs"]]] = field(default_factory=list)
    # speculative decoding: for the k-th draw, when it verified proposals, one entry per token it emitted
    spec: dict[int, list["RowLogprobs"]] = field(default_factory=dict)


def wants_prompt_logprobs(s: "Sequence") -> bool:
    """Whether `s` still needs log-probabilities of some of its prompt tokens."""
    return s.prompt_logprobs is not None and len(s.prompt_logprobs) < s.num_prompt_tokens


def prompt_rows(s: "Sequence") -> tuple[int, int]:
    """The rows of `s`'s scheduled tokens whose logits give prompt log-probabilities it has not got
    yet: (first row within its chunk, how many). Row `r` is position `c + r`, which predicts prompt
    token `c + r + 1`."""
    if not wants_prompt_logprobs(s):
        return 0, 0
    c, q = s.num_computed_tokens, s.num_scheduled_tokens
    first = max(c, len(s.prompt_logprobs) - 1)      # the position predicting the next missing token
    last = min(c + q, s.num_prompt_tokens - 1)       # (the prompt's last position predicts a generated token)
    return (first - c, last - first) if last > first else (0, 0)


def entry(row: "RowLogprobs") -> dict[int, Logprob]:
    """One position's entry, as `CompletionOutput.logprobs` holds it: the token, then the top-k."""
    out = {row.token_id: Logprob(row.logprob, row.rank)}
    for rank, (t, v) in enumerate(zip(row.top_ids, row.top_logprobs), 1):
        if t not in out:
            out[t] = Logprob(v, rank)
    return out


def record_sampled(s: "Sequence", row: "RowLogprobs | None") -> None:
    """Append the entry of `s`'s newest token (it asked for log-probabilities: `row` is there)."""
    if s.logprobs is None:
        return
    if row is None:  # (cannot happen for a token that was sampled; kept so a list never falls short)
        raise AssertionError(f"request {s.request_id}: a token without its log-probability")
    s.logprobs.append(entry(row))
    s.cumulative_logprob += row.logprob


def record_prompt(s: "Sequence", token_index: int, rows: list["RowLogprobs"]) -> None:
    """Prompt entries for tokens `token_index ..` of `s` (only those it has not got yet)."""
    pl = s.prompt_logprobs
    for i, row in enumerate(rows, token_index):
        if i == len(pl):
            pl.append(entry(row))


def fill_decoded(entries: list | None, tokenizer: Any) -> None:
    """Give the newest entries (those without) each token's text; stops at the first one that has it."""
    if not entries or tokenizer is None:
        return
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        if e is None or next(iter(e.values())).decoded_token is not None:
            return
        entries[i] = {t: Logprob(lp.logprob, lp.rank, tokenizer.decode([t])) for t, lp in e.items()}
