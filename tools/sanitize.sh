#!/bin/bash
# compute-sanitizer over Chord's kernels (issues 7 and 27: memory-safe whatever the routing says).
#
#   tools/sanitize.sh             # memcheck, racecheck and synccheck over tools/sanitize_cases.py
#                                 # (every family x main loop, edge and bad routing values, and the
#                                 # trusted paths' cases), then memcheck over the memory-safety GPU tests
#   tools/sanitize.sh --quick     # the same with two schedules per family (the trusted cases included)
#   tools/sanitize.sh --trusted   # memcheck over the trusted-path cases only: every family x main loop
#                                 # (mma, wgmma) x bad routing value x trusted path (chord.ops with
#                                 # check_routing=False, a launch plan from C, the humming root)
#   tools/sanitize.sh --bulk-and-pairs  # the three tools over the bulk-copy / TMA / CTA-pair cases only
#   tools/sanitize.sh --schedules ID[,ID...]  # the three tools over these schedules' ordinary cases only
#   tools/sanitize.sh -k masked   # memcheck over a pytest selection of tests/gpu/test_kernels_gpu.py only
#
# torch's caching allocator hides out-of-bounds accesses inside its pool, so it is switched off
# (PYTORCH_NO_CUDA_MEMORY_CACHING=1): every tensor is its own allocation and memcheck sees a read
# or write past it. tools/sanitize_cases.py exits 1 unless every kernel demonstrably ran (the rows
# its routing names were written and match the reference; each trusted case prints its schedule
# and its launches by path, and fails if its path did not launch). Exits non-zero on any sanitizer
# error, failed proof or test failure. `python tools/sanitize_cases.py --list` prints every case
# (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
SAN="compute-sanitizer --error-exitcode 1 --print-limit 20"
if [ "${1:-}" = "--trusted" ]; then
  echo "== compute-sanitizer --tool memcheck: tools/sanitize_cases.py --trusted"
  exec $SAN --tool memcheck python3 tools/sanitize_cases.py --trusted
fi
if [ "$#" -gt 0 ] && [ "$1" != "--quick" ] && [ "$1" != "--bulk-and-pairs" ] && [ "$1" != "--schedules" ]; then
  exec $SAN --tool memcheck python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py "$@"
fi
for tool in memcheck racecheck synccheck; do
  echo "== compute-sanitizer --tool $tool: tools/sanitize_cases.py $*"
  $SAN --tool $tool python3 tools/sanitize_cases.py "$@"
done
if [ "${1:-}" = "--bulk-and-pairs" ] || [ "${1:-}" = "--schedules" ]; then exit 0; fi
echo "== compute-sanitizer --tool memcheck: memory-safety GPU tests"
$SAN --tool memcheck python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_kernels_gpu.py \
  -k "clamped or stay_in_bounds or overallocated"
