"""The random-weight checkpoint serve_cost measures a bigger model with: it loads as the engine's model,
with the tiny model's byte tokenizer, and matches transformers' own forward pass on it."""
import pytest
import torch

from inflight.bench.serve.process import save_random_checkpoint
from inflight.model.loading import load_pretrained
from inflight.model.tokenizer import ByteTokenizer


def test_random_checkpoint_loads_with_the_byte_tokenizer_and_matches_transformers(tmp_path):
    from transformers import LlamaForCausalLM

    folder = save_random_checkpoint(tmp_path / "ckpt", hidden_size=256, num_layers=2, seed=3)
    model, tok = load_pretrained(folder, device="cpu", with_tokenizer=True)
    assert isinstance(tok, ByteTokenizer)
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (256, 2, 4, 2)
    ids = torch.tensor([tok.encode("def add(a, b):")])
    ref = LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        theirs = ref(ids).logits
        ours = model.forward_dense(ids)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_random_checkpoint_seed_decides_the_weights(tmp_path):
    a = load_pretrained(save_random_checkpoint(tmp_path / "a", 128, 1, seed=0), device="cpu")
    b = load_pretrained(save_random_checkpoint(tmp_path / "b", 128, 1, seed=0), device="cpu")
    c = load_pretrained(save_random_checkpoint(tmp_path / "c", 128, 1, seed=1), device="cpu")
    wa, wb, wc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


@pytest.mark.parametrize("hidden, layers", [(100, 2), (256, 0)])
def test_random_checkpoint_refuses_shapes_it_cannot_build(tmp_path, hidden, layers):
    with pytest.raises(ValueError, match="hidden_size must be a multiple of 128"):
        save_random_checkpoint(tmp_path, hidden, layers)
