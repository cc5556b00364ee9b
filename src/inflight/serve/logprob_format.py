"""The engine's log-probabilities (`CompletionOutput.logprobs`: per token a dict of `Logprob`s, the
token first, then the top k) in OpenAI's two shapes:

* completions (the legacy shape): parallel lists `tokens`, `token_logprobs`, `top_logprobs` (a dict
  token text -> log-probability: the top k and the token itself, as vLLM writes it) and
  `text_offset` (where each token's text starts in the choice's text); with `echo`, the prompt's
  tokens come first, the very first with no log-probability (nothing predicts it);
* chat: `content`, a list of `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`
  with exactly the top k alternatives, most likely first.

A log-probability of -inf (a token the model rules out) is written as -9999.0, as vLLM does: JSON
has no infinity.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["completion_logprobs", "chat_logprobs", "FLOOR"]

FLOOR = -9999.0


def _value(x: float) -> float:
    return FLOOR if math.isinf(x) and x < 0 else x


def _text(tokenizer: Any, token: int, lp: Any = None) -> str:
    decoded = getattr(lp, "decoded_token", None)
    return decoded if decoded is not None else tokenizer.decode([token])


def completion_logprobs(token_ids: Sequence[int], entries: Sequence[dict | None], k: int, tokenizer: Any,
                        offset: int = 0) -> tuple[dict, int]:
    """The legacy `logprobs` object of these tokens (text offsets counted from `offset`), and the
    offset after the last one."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t, e in zip(token_ids, entries):
        if e is None:  # the prompt's first token
            text, value, top = _text(tokenizer, t), None, None
        else:
            text, value = _text(tokenizer, t, e[t]), _value(e[t].logprob)
            top = {_text(tokenizer, u, x): _value(x.logprob) for u, x in e.items() if x.rank <= k or u == t}
        out["tokens"].append(text)
        out["token_logprobs"].append(value)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


def chat_logprobs(token_ids: Sequence[int], entries: Sequence[dict], k: int, tokenizer: Any) -> list[dict]:
    """The chat `logprobs.content` entries of these tokens."""
    out = []
    for t, e in zip(token_ids, entries):
        text = _text(tokenizer, t, e[t])
        top = sorted(((u, x) for u, x in e.items() if x.rank <= k), key=lambda ux: ux[1].rank)[:k]
        out.append({"token": text, "logprob": _value(e[t].logprob), "bytes": list(text.encode("utf-8")),
                    "top_logprobs": [{"token": (s := _text(tokenizer, u, x)), "logprob": _value(x.logprob),
                                      "bytes": list(s.encode("utf-8"))} for u, x in top]})
    return out
