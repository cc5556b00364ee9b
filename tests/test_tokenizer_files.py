"""The tiny model's Hugging Face tokenizer files are `ByteTokenizer`, exactly: `AutoTokenizer` loaded
from the assets folder encodes and decodes every text and every id sequence as the engine's own
tokenizer does (unicode, control bytes, invalid UTF-8, the end-of-text token and text that only
reads like it), its chat template writes the server's chat, the committed files are what the
builder writes, and the engine generates the same with either tokenizer."""
from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given, settings, strategies as st

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from inflight.model.loading import TINY_PATH, load_config, load_tokenizer  # noqa: E402
from inflight.model.tokenizer import (EOT_TEXT, ByteTokenizer, HFTokenizer, byte_tokenizer_files,  # noqa: E402
                                      write_byte_tokenizer_files)

TOK = ByteTokenizer()
HF = transformers.AutoTokenizer.from_pretrained(str(TINY_PATH))
# text with what trips tokenizers: control bytes, NUL, lone combining marks, emoji, the end-of-text
# token's own text, spaces a tokenizer might strip or merge
TEXT = st.text(st.characters(codec="utf-8"), max_size=60) | st.lists(
    st.sampled_from(["\x00", "\x1b[0m", "\r\n", "\t", "  ", "é", "€", "😀", "\u0301", "\ufeff", EOT_TEXT, "<|", "x"]),
    max_size=12).map("".join)


def test_the_committed_files_are_what_the_builder_writes(tmp_path):
    max_len = load_config(TINY_PATH).max_position_embeddings
    for name, text in byte_tokenizer_files(max_len).items():
        assert (TINY_PATH / name).read_text(encoding="utf-8") == text, f"{name} is stale: run write_byte_tokenizer_files"
    write_byte_tokenizer_files(tmp_path, max_len)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def test_the_special_tokens_and_sizes_agree():
    assert len(HF) == TOK.vocab_size == 257
    assert HF.eos_token_id == HF.bos_token_id == HF.pad_token_id == TOK.eos_token_id == 256
    assert HF.convert_ids_to_tokens(256) == EOT_TEXT and HF.model_max_length == 512


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_autotokenizer_encodes_every_text_as_the_engine_does(text):
    assert HF.encode(text, add_special_tokens=False) == TOK.encode(text)
    assert HF.encode(text) == HF(text)["input_ids"] == TOK.encode_prompt(text)  # (end-of-text first)
    assert HF.decode(TOK.encode(text)) == text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 256), max_size=40) | st.lists(st.sampled_from([0xC3, 0xA9, 0xE2, 0x82, 0xFF, 256, 10]),
                                                              max_size=12))
def test_autotokenizer_decodes_every_id_sequence_as_the_engine_does(ids):
    """Invalid and cut-off UTF-8 included (one U+FFFD per bad sequence, in both), with and without
    the end-of-text token's text (each library's default differs: asked for explicitly)."""
    assert HF.decode(ids, skip_special_tokens=True) == TOK.decode(ids, skip_special_tokens=True)
    assert HF.decode(ids, skip_special_tokens=False) == TOK.decode(ids, skip_special_tokens=False)


def test_the_chat_template_writes_the_servers_chat():
    from inflight.serve.protocol import render_chat

    for messages in ([{"role": "user", "content": "hi"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(x):"},
                      {"role": "assistant", "content": "    return x"}, {"role": "user", "content": "é\n"}]):
        text = HF.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == render_chat(messages, TOK)
        assert HF(text)["input_ids"] == TOK.encode_prompt(render_chat(messages, TOK))  # the server's prompt ids
        assert HF.apply_chat_template(messages, tokenize=False) == render_chat(messages, TOK, add_generation_prompt=False)
        opened = HF.apply_chat_template(messages + [{"role": "assistant", "content": "def"}], tokenize=False,
                                        continue_final_message=True)
        assert opened == render_chat(messages + [{"role": "assistant", "content": "def"}], TOK,
                                     continue_final_message=True)


def test_load_pretrained_users_get_the_same_tokenizer_either_way(tmp_path, tiny):
    """`load_tokenizer` of the assets is `ByteTokenizer`; of a copy without the marker in config.json,
    the `HFTokenizer` over these files — and the engine answers the same with either."""
    from inflight import LLMEngine, SamplingParams

    assert isinstance(load_tokenizer(TINY_PATH), ByteTokenizer)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_PATH / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["inflight_tokenizer"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = load_tokenizer(tmp_path)
    assert isinstance(hf, HFTokenizer)
    for text in ("def f(x):\n", "héllo\x00", EOT_TEXT):
        assert hf.encode_prompt(text) == TOK.encode_prompt(text)
        assert hf.decode(TOK.encode(text) + [256], skip_special_tokens=False) == TOK.decode(
            TOK.encode(text) + [256], skip_special_tokens=False)
    prompts = ["def add(a, b):", "# é\n", "def f():\n    pass\n"]
    params = [SamplingParams(max_tokens=30), SamplingParams(max_tokens=30, temperature=1.5, seed=3, stop=["\n\n"]),
              SamplingParams(max_tokens=20, ignore_eos=True, skip_special_tokens=False)]
    outs = [LLMEngine(tiny[0], tokenizer=t, block_size=16, num_blocks=32).generate(prompts, params, use_tqdm=False)
            for t in (TOK, hf)]
    assert [(o.token_ids, o.text, o.finish_reason) for o in outs[0]] == \
           [(o.token_ids, o.text, o.finish_reason) for o in outs[1]]
