"""Tokenizers with one small interface: `encode(str) -> list[int]`, `decode(list[int]) -> str`, `eos_token_id`.

`ByteTokenizer` is the shipped tiny model's: the 256 byte values plus one end-of-text token (256),
so any UTF-8 text round-trips and nothing needs a vocabulary file. `HFTokenizer` wraps a Hugging
Face `AutoTokenizer` behind the same interface for real checkpoints.

The tiny model's folder also carries the same tokenizer as Hugging Face files (`tokenizer.json`,
`tokenizer_config.json`, written by `byte_tokenizer_files`), so that tools that load a tokenizer
by path — `transformers`, guidellm, aiperf, vLLM — get exactly `ByteTokenizer`'s ids:
`AutoTokenizer.from_pretrained(TINY_PATH)` encodes a text as its UTF-8 bytes (end-of-text first
with the special tokens, as `encode_prompt`; text that reads "<|endoftext|>" is bytes, never the
token), and decodes as `decode` does, with or without special tokens.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

__all__ = ["ByteTokenizer", "HFTokenizer", "byte_tokenizer_files", "write_byte_tokenizer_files",
           "BYTE_CHAT_TEMPLATE", "EOT_TEXT"]

#: the end-of-text token's text (what `decode(..., skip_special_tokens=False)` writes for it)
EOT_TEXT = "<|endoftext|>"
#: the chat the server writes for the tiny model (`inflight.serve.protocol.PLAIN_CHAT_TEMPLATE`), as a
#: Hugging Face chat template; the server's prompt is its text with the special tokens (end-of-text
#: first): `tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)).input_ids`
BYTE_CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255, plus end-of-text = 256."""

    vocab_size = 257
    eos_token_id = 256
    # documents are separated by end-of-text in training, so "start of a document" = "after end-of-text"
    bos_token_id = 256
    pad_token_id = 256

    def encode(self, text: str, add_eos: bool = False, add_bos: bool = False) -> list[int]:
        """The UTF-8 bytes of `text` (with end-of-text before it when `add_bos`, after it when `add_eos`).

        A prompt that starts a new function reads better with `add_bos=True`."""
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode expects a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return ([self.bos_token_id] if add_bos else []) + ids + ([self.eos_token_id] if add_eos else [])

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt as the model saw documents in training: end-of-text (the document separator) first."""
        return self.encode(text, add_bos=True)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; a cut-off multi-byte character shows as U+FFFD instead of raising."""
        out = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                out.append(i)
            elif i == self.eos_token_id:
                if not skip_special_tokens:
                    out.extend(EOT_TEXT.encode())
            else:
                raise ValueError(f"token id {i} is outside the byte tokenizer's vocabulary (0..256)")
        return out.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=257, eos_token_id=256)"


class HFTokenizer:
    """A Hugging Face tokenizer behind the `ByteTokenizer` interface."""

    def __init__(self, hf_tokenizer: Any):
        self.hf = hf_tokenizer
        self.eos_token_id = hf_tokenizer.eos_token_id
        self.bos_token_id = getattr(hf_tokenizer, "bos_token_id", None)
        self.pad_token_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else self.eos_token_id
        self.vocab_size = len(hf_tokenizer)

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> "HFTokenizer":
        from transformers import AutoTokenizer  # only needed for real checkpoints

        return cls(AutoTokenizer.from_pretrained(path, **kwargs))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt with the checkpoint's special tokens (BOS for Llama), as serving engines encode it."""
        return self.encode(text, add_special_tokens=True)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False) -> list[int]:
        """Token ids of a chat, using the checkpoint's own template (`continue_final_message`: the last
        message left open for the model to continue, as transformers and vLLM do it)."""
        extra = {"continue_final_message": True} if continue_final_message else {}
        out = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True, **extra)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size}, eos_token_id={self.eos_token_id})"


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what a byte-level BPE vocabulary is written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(rest)}}


def byte_tokenizer_files(max_length: int) -> dict[str, str]:
    """`ByteTokenizer` as Hugging Face files, {file name: JSON text}: a byte-level BPE with no merges
    whose id for each byte is the byte (not GPT-2's order), end-of-text as the special token 256
    (put first by the post-processor, as `encode_prompt` does; never matched in text:
    `split_special_tokens`), and the plain chat template. Built with the `tokenizers` library."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    stand_in = _byte_to_unicode()
    tok = Tokenizer(models.BPE(vocab={stand_in[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT_TEXT, special=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(single=f"{EOT_TEXT} $A", pair=f"{EOT_TEXT} $A {EOT_TEXT} $B",
                                                       special_tokens=[(EOT_TEXT, ByteTokenizer.eos_token_id)])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT_TEXT, "eos_token": EOT_TEXT,
              "pad_token": EOT_TEXT, "model_max_length": max_length, "split_special_tokens": True,
              "clean_up_tokenization_spaces": False, "chat_template": BYTE_CHAT_TEMPLATE}
    return {"tokenizer.json": json.dumps(json.loads(tok.to_str()), indent=1, ensure_ascii=False) + "\n",
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}


def write_byte_tokenizer_files(folder: str | Path, max_length: int) -> None:
    """Write `byte_tokenizer_files` into a checkpoint folder (the tiny model's: `train_tiny.save`)."""
    for name, text in byte_tokenizer_files(max_length).items():
        (Path(folder) / name).write_text(text, encoding="utf-8")
