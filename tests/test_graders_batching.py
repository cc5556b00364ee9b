"""The "Why batching" grader accepts the reference and explains independently written wrong answers."""
import pytest

from inflight.exercises.batching import MODEL_SHAPES, check_kv_bytes_per_token, kv_bytes_per_token


def right(cfg, nbytes):
    per_layer = cfg.num_key_value_heads * cfg.head_dim
    return 2 * per_layer * cfg.num_hidden_layers * nbytes


def test_reference_and_an_equivalent_answer_pass():
    assert check_kv_bytes_per_token(kv_bytes_per_token, quiet=True)
    assert check_kv_bytes_per_token(right, quiet=True)


def test_known_values():
    assert kv_bytes_per_token(MODEL_SHAPES["Llama-2-7B"], 2) == 512 * 1024  # 0.5 MiB per token in fp16
    assert kv_bytes_per_token(MODEL_SHAPES["Llama-3-8B"], 2) == 128 * 1024  # GQA: 4x less
    assert kv_bytes_per_token(MODEL_SHAPES["inflight tiny"], 4) == 4096


def mutant_no_v(cfg, nbytes):
    return cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * nbytes


def mutant_query_heads(cfg, nbytes):
    return 2 * cfg.num_hidden_layers * (cfg.num_attention_heads * cfg.head_dim) * nbytes


def mutant_hidden(cfg, nbytes):
    k = cfg.hidden_size * nbytes
    return 2 * k * cfg.num_hidden_layers


def mutant_one_layer(cfg, nbytes):
    return 2 * cfg.num_key_value_heads * cfg.head_dim * nbytes


def mutant_bits(cfg, nbytes):
    bits = nbytes * 8
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * bits


def mutant_qkv(cfg, nbytes):
    return (1 + 2) * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * nbytes


def mutant_head_dim_from_hidden(cfg, nbytes):
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * nbytes


def mutant_values_not_bytes(cfg, nbytes):
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim


@pytest.mark.parametrize("mutant, mistake", [
    (mutant_no_v, "only K, not V"),
    (mutant_query_heads, "attention heads instead of KV heads"),
    (mutant_hidden, "hidden size instead of KV width"),
    (mutant_one_layer, "forgot the layers"),
    (mutant_bits, "bits instead of bytes"),
    (mutant_qkv, "counted Q too"),
    (mutant_values_not_bytes, "forgot the bytes"),
    (mutant_head_dim_from_hidden, "head_dim from hidden_size"),
])
def test_mutants_rejected_with_the_right_explanation(mutant, mistake):
    result = check_kv_bytes_per_token(mutant, quiet=True)
    assert not result
    assert result.mistake == mistake, result.report
    assert result.report.count("💡") == 1 and "🤔" not in result.report  # one diagnosis, never contradicted


def test_a_constant_answer_is_named_as_such():
    result = check_kv_bytes_per_token(lambda c, b: 12345, quiet=True)
    assert not result and result.mistake == "the same answer for every model" and result.failed_case


def test_stub_is_not_implemented():
    def stub(cfg, nbytes):
        raise NotImplementedError

    result = check_kv_bytes_per_token(stub, quiet=True)
    assert not result and result.not_implemented
