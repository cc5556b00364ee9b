"""Loading Hugging Face checkpoints: the supported families, sharded weights, and clear errors."""
import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from inflight.model.loading import TINY_PATH, load_pretrained, load_tiny, load_tokenizer
from inflight.model.tokenizer import ByteTokenizer

SMALL = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).eval()
    folder = tmp_path_factory.mktemp("llama")
    hf.save_pretrained(folder)
    return hf, folder


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _logits(model, ids):
    with torch.no_grad():
        return model.forward_dense(ids)


def test_sharded_checkpoint(llama_dir, tmp_path):
    hf, _ = llama_dir
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model = load_pretrained(tmp_path, device="cpu")
    ids = torch.arange(9)[None] % SMALL["vocab_size"]
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, ids), hf(ids).logits, atol=1e-4, rtol=0)
    assert not any(p.requires_grad for p in model.parameters())


def test_meta_device_construction_path(llama_dir, monkeypatch):
    import inflight.model.loading

    monkeypatch.setattr(inflight.model.loading, "META_INIT_MIN_PARAMS", 0)  # as for a big checkpoint
    hf, folder = llama_dir
    model = load_pretrained(folder, device="cpu")
    ids = torch.arange(7)[None]
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, ids), hf(ids).logits, atol=1e-4, rtol=0)


def test_dtype_argument(llama_dir):
    model = load_pretrained(llama_dir[1], device="cpu", dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16


def test_mistral_sliding_window_is_capped_with_a_warning(tmp_path):
    torch.manual_seed(0)
    hf = transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, sliding_window=16)).eval()
    hf.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="sliding-window"):
        model = load_pretrained(tmp_path, device="cpu")
    assert model.config.max_position_embeddings == 16
    ids = torch.arange(12)[None]
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, ids), hf(ids).logits, atol=1e-4, rtol=0)


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)


def test_unsupported_architecture(tmp_path):
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10)
    cfg.architectures = ["GPT2LMHeadModel"]
    cfg.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_pretrained(tmp_path)


def test_missing_weights(llama_dir, tmp_path):
    folder = _copy(llama_dir[1], tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors.*pytorch_model\.bin"):
        load_pretrained(folder)


def test_missing_shard(llama_dir, tmp_path):
    llama_dir[0].save_pretrained(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        load_pretrained(tmp_path)


def test_shape_mismatch_names_the_tensor(llama_dir, tmp_path):
    folder = _copy(llama_dir[1], tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"shape mismatch for model\.layers\.0\.mlp\.gate_proj\.weight"):
        load_pretrained(folder)


def test_missing_tensor_is_named(llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(llama_dir[1], tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing 1 tensor.*layers\.1\.self_attn\.k_proj"):
        load_pretrained(folder)


def test_no_tokenizer_files(llama_dir):
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(llama_dir[1])


@pytest.mark.skipif(not (TINY_PATH / "model.safetensors").is_file(), reason="tiny model not trained yet")
def test_tiny_model_loads_in_both_libraries_and_writes_python():
    model, tok = load_tiny()
    assert isinstance(tok, ByteTokenizer) and isinstance(load_tokenizer(TINY_PATH), ByteTokenizer)
    assert 2e6 < model.num_parameters() < 5e6
    hf = transformers.LlamaForCausalLM.from_pretrained(TINY_PATH).eval()
    ids = torch.tensor([tok.encode("def add(a, b):\n    return a + b\n")])
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, ids), hf(ids).logits, atol=1e-4, rtol=0)
    from inflight.model.generate import generate

    prompt = "def fibonacci(n):\n"
    out = generate(model, [tok.encode(prompt, add_bos=True)], max_new_tokens=200)[0]
    text = tok.decode(out)
    assert text.startswith("    ")  # the body is indented: it learned Python's shape
    assert any(word in text for word in ("return", "if ", "for ", "self", "="))
