#!/bin/sh
# run_groups.sh - run every groups benchmark (issue 3) in one go from an
# existing build dir; it builds nothing.
#
# Usage: bench/run_groups.sh [BUILD_DIR]      (default: build)
#   BUILD_DIR must hold bench/bench_groups (and bench/bench_groups_mpi when
#   meshpg was built with MPI; without it the MPI runs are skipped).
# Environment:
#   REPEAT       timed passes per measurement (default 5; MPI create runs use
#                REPEAT_MPI, default 11, as oversubscribed MPI is noisier)
#   MPI_NPROCS   process counts of the MPI create runs (default "4 8 16")
# Runs:
#   1. group creation, ours vs baseline: thread backend at 8, 64, 256, 1024
#      ranks, then the MPI backend at each of MPI_NPROCS processes, as one
#      table;
#   2. all_reduce bandwidth: thread backend (8 ranks), MPI (4 processes).
# Exit status: 0 when every run passed, 1 when one failed, 2 on a usage error.
set -u

if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  echo "usage: $0 [BUILD_DIR]   (default: build)" >&2
  [ $# -gt 1 ] && exit 2
  exit 0
fi
B=${1:-build}
REPEAT=${REPEAT:-5}
REPEAT_MPI=${REPEAT_MPI:-11}
MPI_NPROCS=${MPI_NPROCS:-"4 8 16"}
T=$B/bench/bench_groups
M=$B/bench/bench_groups_mpi
if [ ! -x "$T" ]; then
  echo "$0: $T not found: build first (ninja -C $B)" >&2
  exit 2
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none --mca btl self,vader"
rc=0
have_mpi=0
if [ -x "$M" ] && command -v mpirun >/dev/null 2>&1; then have_mpi=1; fi

echo "== 1. group creation: ours vs baseline ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
"$T" create --repeat "$REPEAT" || rc=1
if [ $have_mpi = 1 ]; then
  for n in $MPI_NPROCS; do
    $MPIRUN -np "$n" "$M" create --repeat "$REPEAT_MPI" --no-header || rc=1
  done
else
  echo "(no bench_groups_mpi in $B: MPI runs skipped)"
fi

echo
echo "== 2. all_reduce bandwidth"
"$T" allreduce --ranks 8 --repeat "$REPEAT" || rc=1
if [ $have_mpi = 1 ]; then
  $MPIRUN -np 4 "$M" allreduce --repeat "$REPEAT" || rc=1
fi
exit $rc
