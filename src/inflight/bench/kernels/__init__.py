"""Kernel benchmarks: one operation at a time, each implementation beside the others.

- `attention` — `python -m inflight.bench.kernels.attention`: the paged-KV chapter's figures (KV
  memory utilisation of contiguous and paged caches; on CUDA the Triton decode kernel against SDPA,
  measured by `triton_decode`);
- `cpu` — `python -m inflight.bench.kernels.cpu`: the C code of the CPU path (attention, the fused
  layer operators, the skinny GEMMs) against the plain-torch reference, alternating in one process;
- `prompt_attention` — `python -m inflight.bench.kernels.prompt_attention`: the C kernel on a prefill
  chunk's attention (its prompt tiles), optionally beside another checkout's kernel (`--source`);
- `decode_step` — one decode step at batch 1, with and without CUDA graphs.
"""
