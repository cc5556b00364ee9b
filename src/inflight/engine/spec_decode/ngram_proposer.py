"""Prompt lookup (n-gram) proposals: no second model, just the request's own tokens.

Text repeats itself — code above all: an identifier, an argument list, `self.` — so the tokens that
followed the previous occurrence of the request's latest n tokens are a good guess for what comes
next. For n from `prompt_lookup_max` down to `prompt_lookup_min`, find the most recent earlier
occurrence of the last n tokens (prompt and generated tokens alike) and propose the (up to) `k`
tokens that followed it; no occurrence of any n: no proposal, and the request decodes as usual.

The search is `str.rfind` over the token ids mapped to characters (one C-level scan per n), so a
step over 64 requests of 500 tokens costs well under a millisecond. vLLM's `NgramProposer`
(`vllm/v1/spec_decode/ngram_proposer.py`) does the same with a KMP search in numba.
"""
from __future__ import annotations

from typing import Sequence as Seq

__all__ = ["ngram_propose", "NgramProposer"]


def ngram_propose(token_ids: Seq[int], k: int, n_min: int = 1, n_max: int = 3) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix of
    `token_ids` of n_min..n_max tokens; [] when there is none."""
    L = len(token_ids)
    if k <= 0 or L < 2:
        return []
    text = "".join(map(chr, token_ids))
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        at = text.rfind(text[L - n:], 0, L - 1)  # an occurrence that ends before the last token
        if at >= 0:
            start = at + n
            return list(token_ids[start:start + k])
    return []


class NgramProposer:
    """`propose(seqs, ks)`: for each request, up to `ks[i]` prompt-lookup proposals."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int):
        self.n_min, self.n_max = prompt_lookup_min, prompt_lookup_max

    def propose(self, seqs: list, ks: list[int]) -> list[list[int]]:
        return [ngram_propose(s.token_ids, k, self.n_min, self.n_max) for s, k in zip(seqs, ks)]

    def release(self, seq) -> None:  # (no per-request state)
        pass
