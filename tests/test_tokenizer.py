"""Byte tokenizer round-trips any UTF-8; the Hugging Face adapter has the same interface."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inflight.model.tokenizer import ByteTokenizer, HFTokenizer

tok = ByteTokenizer()


@given(st.text())
def test_round_trip_any_text(text):
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_eos_and_special_tokens():
    assert tok.vocab_size == 257 and tok.eos_token_id == 256
    ids = tok.encode("héllo", add_eos=True)
    assert ids[-1] == 256 and len(ids) == len("héllo".encode()) + 1
    assert tok.decode(ids) == "héllo"
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|endoftext|>")
    assert tok.encode("x", add_bos=True) == [256, ord("x")]


def test_partial_multibyte_sequence_decodes_with_replacement():
    ids = tok.encode("€")  # three bytes
    assert tok.decode(ids[:2]) == "\ufffd"
    assert tok.decode(ids[:2] + ids[2:]) == "€"


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="expects a str"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="outside"):
        tok.decode([300])


def _hf_tokenizer(tmp_path):
    """A tiny byte-level BPE tokenizer built offline with `tokenizers`, saved the transformers way."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["def f(x):\n    return x + 1\n"] * 20, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>")
    fast.save_pretrained(tmp_path)
    return tmp_path


def test_hf_adapter_same_interface(tmp_path):
    from inflight.model.loading import load_tokenizer

    t = load_tokenizer(_hf_tokenizer(tmp_path))
    assert isinstance(t, HFTokenizer)
    text = "def g(y):\n    return y\n"
    assert t.decode(t.encode(text)) == text
    assert t.eos_token_id == t.hf.convert_tokens_to_ids("</s>")
    assert t.decode(t.encode(text) + [t.eos_token_id]) == text  # special tokens skipped
