"""Incremental detokenization and stop strings (vLLM's `vllm/v1/engine/detokenizer.py`).

A streamed request shows its text while it is being written, so each step must turn the request's
new tokens into new *characters*, and a token is not a character: the tiny model's byte tokens
split every non-ASCII character into two to four tokens, and Hugging Face tokenizers attach a
word's leading space to the token, which decodes differently at the start of a text. So the
detokenizer decodes a short *window* of the latest tokens, takes what it adds to the window's text
so far, and:

- holds back text that ends in an incomplete character (the decoder's U+FFFD replacement) until
  the next token completes it — a client never sees a half character;
- checks the request's stop strings on the text (they need not fall on token boundaries), cuts
  the text before the first one found and ends the request; and while the request runs, holds
  back the last `len(longest stop string) - 1` characters, which may be the start of a stop string
  the next token completes (a client never sees text that turns out to be part of a stop string).

One `decode` call per step in the steady state; the window moves on (keeping a few tokens of
context, for the leading space) every `WINDOW_TOKENS` tokens, so the cost per step stays flat
however long the request gets.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["IncrementalDetokenizer", "text_token_ids", "WINDOW_TOKENS", "CONTEXT_TOKENS"]

#: the window restarts once it holds this many decoded tokens ...
WINDOW_TOKENS = 32
#: ... keeping this many as context (a word's leading space decodes from the token before it)
CONTEXT_TOKENS = 4
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """The text of one request's generated tokens, extended a step at a time (see the module docstring).

    `update(output_token_ids, finished)` takes *all* the request's generated tokens so far (so a
    step interrupted half-way is simply redone by the next call) and returns the stop string that
    ended the request, or None. `text(finished)` is what a client may be shown now."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        # (passed only when False: a tokenizer of one's own may take no such argument)
        self._decode_kw = {} if skip_special_tokens else {"skip_special_tokens": False}
        self.stop = tuple(stop)
        self.stop_buffer = max((len(s) for s in self.stop), default=1) - 1
        self.stop_reason: str | None = None  # the stop string that ended the request
        self.output_text = ""    # the text of tokens[:read], complete characters only
        self._start = 0          # first token of the window
        self._read = 0           # tokens whose text is in output_text
        self._window_text = ""   # decode(tokens[_start:_read]), the text the window already gave

    def update(self, output_token_ids: Sequence[int], finished: bool = False) -> str | None:
        """Take the request's tokens up to now; return the stop string found in its text, if any
        (the text then ends before it). With `finished`, nothing is held back any more."""
        n = len(output_token_ids)
        if n == self._read:
            return None
        decoded = self.tokenizer.decode(list(output_token_ids[self._start:n]), **self._decode_kw)
        if decoded.endswith(REPLACEMENT) and not finished:  # an incomplete character: wait for the rest
            return None
        new = decoded[len(self._window_text):]
        start, window_text = self._start, decoded
        if n - start >= WINDOW_TOKENS:  # move the window on (one more decode, every few steps)
            start = n - CONTEXT_TOKENS
            window_text = self.tokenizer.decode(list(output_token_ids[start:n]), **self._decode_kw)
        # (only now, when nothing can fail any more: an interrupted update is simply redone)
        self._start, self._window_text, self._read = start, window_text, n
        before = len(self.output_text)
        self.output_text += new
        return self._find_stop(before)

    def _find_stop(self, before: int) -> str | None:
        """The first stop string that ends in the new text (from `before` on): cut the text there."""
        best = None
        for stop in self.stop:
            at = self.output_text.find(stop, max(0, before - len(stop) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return None
        self.output_text = self.output_text[:best[0]]
        self.stop_reason = best[1]
        return best[1]

    def text(self, finished: bool) -> str:
        """What a client may see now: all of it once the request has ended; while it runs, all but
        the characters that could still turn out to start a stop string."""
        if finished or not self.stop_buffer:
            return self.output_text
        return self.output_text[:max(0, len(self.output_text) - self.stop_buffer)]


def text_token_ids(seq: Any, eos_token_ids: frozenset[int]) -> Sequence[int]:
    """The generated tokens whose text the request shows: all of them, except the end-of-text that
    ended it, which is no text even where special tokens are kept (`skip_special_tokens=False`),
    as vLLM leaves the stop token out."""
    ids = seq.output_token_ids
    if seq.finish_reason == "stop" and not seq.params.skip_special_tokens and ids and ids[-1] in eos_token_ids:
        return ids[:-1]
    return ids
