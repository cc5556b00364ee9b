#!/usr/bin/env bash
# GPU section for the paged decode kernels (issue 14, target 3), to be folded into .ci/gpu:
#   1. tests/test_triton_attention.py on CUDA (the real kernels against the torch reference),
#   2. `python -m inflight.bench.kernels.attention --sweep --tune`: split kernel, single-pass kernel and
#      contiguous SDPA at batch 32-128 x context 512-4096 (Llama-3-8B layer, fp16, blocks of 16),
#      every partition size, and the tile shapes; JSON + a printed table with the targets met.
# Offline: it needs only python3 with torch, triton and pytest, as on the device image. Expected
# 2-3 minutes on an H200 (not yet run there; most of it Triton compiling ~50 kernel variants for
# the tests and --tune); the timeouts cap it at 8 minutes.
# Usage: .ci/gpu_kernel.sh [OUTDIR]    (default: $OUT when set, else results/)
# Writes OUTDIR/attention_<gpu>.json, OUTDIR/gpu_logs/attention_<gpu>.log (the report) and
# OUTDIR/gpu_logs/triton_tests_<gpu>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # the real kernels, not the CPU interpreter
out="${1:-${OUT:-results}}"
mkdir -p "$out/gpu_logs"

python3 -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.cuda.get_device_name(0), '| torch', torch.__version__, '| triton', triton.__version__)" || exit 1
name=$(python3 -c "from inflight.bench.kernels.attention import device_name; print(device_name('cuda'))") || exit 1

echo "== kernel tests on CUDA (tests/test_triton_attention.py)"
# addopts cleared: the project's pytest options name nbval, which the device image does not carry
timeout 180 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_triton_attention.py 2>&1 \
  | tee "$out/gpu_logs/triton_tests_$name.log"
tests_rc=${PIPESTATUS[0]}

echo "== kernel benchmark (python -m inflight.bench.kernels.attention --sweep --tune)"
timeout 300 python3 -m inflight.bench.kernels.attention --sweep --tune --out "$out/attention_$name.json" 2>&1 \
  | tee "$out/gpu_logs/attention_$name.log"
bench_rc=${PIPESTATUS[0]}

echo "== gpu_kernel: tests exit $tests_rc, benchmark exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
