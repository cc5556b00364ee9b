"""The accept/reject rule that keeps the target model's distribution (Leviathan et al. 2023; Chen et al. 2023).

The target model has scored the request's last token and its `k` proposals `x_1..x_k` in one pass:
row `i` of its logits is the distribution `p_i` of the token after `x_1..x_i` (row 0: after the
last real token). The proposer drew `x_i` from its own distribution `q_i` (a greedy draft or an
n-gram lookup: `q_i` puts all its mass on `x_i`). For i = 1, 2, ...:

- accept `x_i` with probability `min(1, p_i(x_i) / q_i(x_i))`, and go on to the next;
- at the first rejection, draw the step's last token from the residual `max(0, p_i - q_i)`,
  renormalised, and stop;
- if all `k` are accepted, draw a bonus token from `p_{k+1}`.

Each emitted token is then distributed exactly as `p` (accepted mass `min(p, q)` plus rejected mass
`(1 - Σ min(p, q)) · (p - q)⁺ / Σ (p - q)⁺` sums to `p`), whatever the proposer guessed: a bad
proposer costs speed, never correctness. Under greedy decoding `p` is one-hot on the argmax, and
the rule is exact match: accept while `x_i` is the target's argmax, then emit the argmax.

`p` is the very distribution the ordinary sampler draws from (`inflight.model.sampler.sample_rows`:
softmax at the temperature, then the top-p nucleus, in float64), so speculation changes the random
numbers a request consumes but not the distribution of its text. vLLM's counterpart is
`vllm/v1/sample/rejection_sampler.py` (batched in a Triton kernel; here one request at a time).
"""
from __future__ import annotations

from typing import Callable, Sequence as Seq

import torch

from inflight.engine.spec_decode.metrics import expected_tokens_per_step

__all__ = ["target_probs", "rejection_sample", "greedy_verify", "expected_tokens_per_step"]


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The distribution the sampler draws from for each row of `logits` (float64): softmax at
    `temperature`, restricted to the top-`top_p` nucleus (ties ordered by token id), renormalised."""
    probs = torch.softmax(logits.double() / float(temperature), dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # (the same rule as sample_rows)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)
    return kept / kept.sum(-1, keepdim=True)


def _draw(p: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from the (unnormalised, non-negative) weights `p` with the uniform `u`."""
    cum = p.cumsum(-1)
    idx = int(torch.searchsorted(cum, torch.tensor([u * cum[-1].item()], dtype=cum.dtype), right=True).item())
    idx = min(idx, p.shape[-1] - 1)
    while idx > 0 and p[idx] <= 0:  # (rounding can land on a zero-weight entry: step back to a real one)
        idx -= 1
    return idx


def greedy_verify(argmax: Seq[int], draft: Seq[int]) -> list[int]:
    """Exact match: the accepted proposals (while each equals the target's argmax) and then the
    target's argmax after them. `argmax[i]` is the target's choice after `draft[:i]`."""
    a = 0
    while a < len(draft) and draft[a] == argmax[a]:
        a += 1
    return list(draft[:a]) + [int(argmax[a])]


def rejection_sample(logits: torch.Tensor, draft: Seq[int], temperature: float, top_p: float,
                     uniform: Callable[[], float], draft_probs: torch.Tensor | None = None) -> list[int]:
    """The tokens one verifying step emits for one request: the accepted proposals, then one token
    drawn by the rule above. `logits` is `[len(draft) + 1, vocab]` (the target's rows), `draft_probs`
    the proposer's `q` rows (`[len(draft), vocab]`; None: each proposal was certain), `uniform()`
    a number in [0, 1) from the request's random stream. `temperature == 0` is greedy: exact match."""
    if temperature == 0:
        return greedy_verify(logits.max(dim=-1).indices.tolist(), draft)
    p = target_probs(logits, temperature, top_p)
    for i, x in enumerate(draft):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        p_x = float(p[i, x])
        if q_x > 0 and uniform() < min(1.0, p_x / q_x):
            continue  # accepted
        if draft_probs is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - draft_probs[i].double()).clamp_(min=0.0)
        if float(residual.sum()) <= 0:  # p == q: a rejection cannot happen but by rounding; p itself then
            residual = p[i]
        return list(draft[:i]) + [_draw(residual, uniform())]
    return list(draft) + [_draw(p[len(draft)], uniform())]
