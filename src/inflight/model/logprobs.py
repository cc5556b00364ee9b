"""Log-probabilities of tokens under the model: the chosen token's, its rank, and the top-k.

`token_logprobs` takes rows of the model's logits (float32, exactly what the sampler is handed),
applies `log_softmax` and reads, per row, the log-probability of one given token (the token that
was sampled, or the prompt token that came next), its rank among the vocabulary (1 = the most
likely; ties share the better rank) and the `k` most likely tokens with theirs. Raw logits, before
temperature and top-p, as vLLM's default `logprobs_mode="raw_logprobs"`: the numbers describe the
model, not the sampling settings, so that the greedy token's log-probability is the largest of the
top-k, and a prompt's log-probabilities are what an evaluation harness scores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["RowLogprobs", "token_logprobs"]


@dataclass(frozen=True)
class RowLogprobs:
    """One row's answer: the token's log-probability and rank, and the top-k (most likely first)."""

    token_id: int
    logprob: float
    rank: int
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], ks: Sequence[int]) -> list[RowLogprobs]:
    """Row r of `logits [R, vocab]`: the log-probability of `token_ids[r]`, its rank, and the
    `ks[r]` most likely tokens (ties in token id order)."""
    if logits.ndim != 2 or logits.shape[0] != len(token_ids) or len(ks) != len(token_ids):
        raise ValueError(f"logits {tuple(logits.shape)} need one token id and one k per row, got "
                         f"{len(token_ids)} and {len(ks)}")
    if not len(token_ids):
        return []
    lp = torch.log_softmax(logits.float(), dim=-1)
    tok = torch.tensor(list(token_ids), dtype=torch.long, device=lp.device).view(-1, 1)
    chosen = lp.gather(1, tok)
    ranks = ((lp > chosen).sum(-1) + 1).tolist()
    k = min(max(ks), lp.shape[1])  # (a vocabulary smaller than k has only so many alternatives)
    if k > 0:
        # the k largest, then ordered by value and, among equal values, by token id: the same order
        # every time (topk's own order of ties is unspecified)
        top_lp, top_ids = lp.topk(k, dim=-1)
        top_ids, order = top_ids.sort(dim=-1)
        top_lp, order2 = top_lp.gather(1, order).sort(dim=-1, descending=True, stable=True)
        top_lp, top_ids = top_lp.tolist(), top_ids.gather(1, order2).tolist()
    else:
        top_lp = top_ids = [[] for _ in token_ids]
    return [RowLogprobs(t, c, r, tuple(ids[:kr]), tuple(v[:kr]))
            for t, c, r, ids, v, kr in zip(token_ids, chosen.view(-1).tolist(), ranks, top_ids, top_lp, ks)]
