#!/bin/bash
# compute-sanitizer memcheck over Chord's kernels (issue 7: memory-safe whatever the routing says).
#
#   tools/sanitize.sh                  # the memory-safety tests + over-allocated/skip-block tests
#   tools/sanitize.sh -k masked        # any pytest selection of tests/gpu/test_kernels_gpu.py
#
# torch's caching allocator hides out-of-bounds accesses inside its pool, so it is switched off
# (PYTORCH_NO_CUDA_MEMORY_CACHING=1): every tensor is its own allocation and memcheck sees a read
# or write past it. Exits non-zero on any memcheck error or test failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
if [ "$#" -eq 0 ]; then
  set -- -k "clamped or stay_in_bounds or overallocated"
fi
exec compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py "$@"
