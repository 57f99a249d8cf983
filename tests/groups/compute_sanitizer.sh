#!/usr/bin/env bash
# The NCCL sync suite under NVIDIA's compute-sanitizer (suite "gpu"): memcheck,
# initcheck, racecheck and synccheck must find 0 errors in meshpg's kernels
# and sync.  NCCL's own probes are not errors: compute-sanitizer reports them
# as "Program hit cudaError..." API notes.  On an H100 (CUDA 13.0, NCCL 2.28)
# memcheck counted 21 of them in its ERROR SUMMARY, and nothing else: 20
# cudaFuncGetAttributes with no kernel image for the device (NCCL probing its
# kernels) and one cuMemCreate "operation not permitted" inside ncclMemAlloc
# (NCCL tries a handle type first and falls back).  So memcheck runs with
# --report-api-errors no: it still counts every memory access error, and an
# API error of meshpg's own fails the suite itself (every call is checked).
# That run: 5 of 5 tests, 0 errors, 126 s.
#
#   compute_sanitizer.sh TEST_PROGRAM [CUDA_ROOT]
#
# Exit 77 (skip) without compute-sanitizer or without a GPU.
set -uo pipefail
prog=$1
root=${2:-/usr/local/cuda}
cs=$(command -v compute-sanitizer || true)
[ -n "$cs" ] || { [ -x "$root/bin/compute-sanitizer" ] && cs=$root/bin/compute-sanitizer; }
[ -n "$cs" ] || { echo "SKIP: compute-sanitizer is not installed (CUDA's bin/)"; exit 77; }
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: no CUDA GPU on this machine: compute-sanitizer needs one"
  exit 77
fi
status=0
for tool in memcheck initcheck racecheck synccheck; do
  log=$(mktemp)
  extra=()
  [ "$tool" = memcheck ] && extra=(--report-api-errors no)
  "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 9 "$prog" --jobs 1 >"$log" 2>&1
  rc=$?
  echo "== $tool: exit $rc; $(grep -E 'ERROR SUMMARY|Synthesis' "$log" | tr '\n' ' ')"
  if [ "$rc" -ne 0 ]; then
    status=1
    tail -n 40 "$log"
  fi
  rm -f "$log"
done
exit $status
