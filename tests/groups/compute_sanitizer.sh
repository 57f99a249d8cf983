#!/usr/bin/env bash
# The NCCL sync suite under NVIDIA's compute-sanitizer (suite "gpu"): memcheck,
# initcheck, racecheck and synccheck must find 0 errors in meshpg's kernels
# and sync.  NCCL's own probes are not errors: compute-sanitizer reports them
# as "Program hit cudaError..." API notes (cudaFuncGetAttributes with no
# kernel image, seen on an H100), which --error-exitcode does not count.
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
  "$cs" --tool "$tool" --error-exitcode 9 "$prog" --jobs 1 >"$log" 2>&1
  rc=$?
  echo "== $tool: exit $rc; $(grep -E 'ERROR SUMMARY|Synthesis' "$log" | tr '\n' ' ')"
  if [ "$rc" -ne 0 ]; then
    status=1
    tail -n 40 "$log"
  fi
  rm -f "$log"
done
exit $status
