"""Chapter 1: kv_bytes_per_token(config, bytes_per_value)."""
from _harness import run

from inflight.exercises import batching as graders


def field(config, name):
    # the config reads both ways; try attributes first
    try:
        return getattr(config, name)
    except AttributeError:
        return config[name]


def correct(config, bytes_per_value):
    per_layer = field(config, "num_key_value_heads") * field(config, "head_dim")
    return 2 * field(config, "num_hidden_layers") * per_layer * bytes_per_value


def w1_hd_over_kv(config, bytes_per_value):
    # head_dim "derived" by splitting the hidden size over the KV heads
    head_dim = field(config, "hidden_size") // field(config, "num_key_value_heads")
    return 2 * field(config, "num_hidden_layers") * field(config, "num_key_value_heads") * head_dim * bytes_per_value


def w2_true_div(config, bytes_per_value):
    # head_dim recomputed with true division: a float result
    head_dim = field(config, "hidden_size") / field(config, "num_attention_heads")
    return 2 * field(config, "num_hidden_layers") * field(config, "num_key_value_heads") * head_dim * bytes_per_value


def w3_no_bytes(config, bytes_per_value):
    # counts values, not bytes (forgets bytes_per_value)
    return 2 * field(config, "num_hidden_layers") * field(config, "num_key_value_heads") * field(config, "head_dim")


def correct_keys(config, bytes_per_value):
    # JSON style: indexes the config like the config.json dict
    return (2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"]
            * bytes_per_value)


ANSWERS = [
    ("correct2", None, correct_keys),
    ("correct", None, correct),
    ("w1", "head_dim taken as hidden_size // num_key_value_heads", w1_hd_over_kv),
    ("w2", "head_dim = hidden_size / num_attention_heads (true division: float; ignores head_dim field)", w2_true_div),
    ("w3", "forgets bytes_per_value: counts values, not bytes", w3_no_bytes),
]

if __name__ == "__main__":
    run("ch01", ANSWERS, graders.check_kv_bytes_per_token)
