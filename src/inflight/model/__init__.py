"""The model layer: a Llama-family decoder over a paged KV cache, its attention (plain-torch
reference and a Triton decode kernel), checkpoint loading, tokenizers, the sampler, and the
shipped tiny model's training script. It imports nothing from the engine or anything above it."""
