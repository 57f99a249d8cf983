#!/usr/bin/env bash
# run_soak.sh - the issue-10 soak: 10,000 gradient-sync steps on the thread
# backend (64 ranks in one process) and on Open MPI (4 processes), sampling
# resident memory, open fds and threads every 500 steps; prints both tables
# and writes the RSS curves as SVG next to the build (BUILD_DIR/bench/).
#
#   bench/run_soak.sh [BUILD_DIR]        (default: build)
#
# Environment: STEPS (10000), EVERY (500), WARMUP (1000: growth is measured
# from the sample at this step to the last), RANKS (64, thread backend), NP
# (4, mpi).  Goal: RSS growth < 1 MiB and no new fd after warm-up (each
# RESULT line says PASS or MISS).  Exit status: 0 when both runs completed,
# 1 when one failed, 2 on a usage error.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
if [ $# -gt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,14p' "$0" >&2
  [ $# -gt 1 ] && exit 2
  exit 0
fi
build=${1:-build}
[[ $build = /* ]] || build="$root/$build"
exe="$build/bench/bench_soak"
[ -x "$exe" ] || { echo "run_soak.sh: $exe not built" >&2; exit 2; }
STEPS=${STEPS:-10000} EVERY=${EVERY:-500} WARMUP=${WARMUP:-1000}
common=(--steps "$STEPS" --every "$EVERY" --warmup "$WARMUP")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

rc=0
echo "== thread backend, ${RANKS:-64} ranks"
/usr/bin/time -f "# wall %e s" "$exe" thread --ranks "${RANKS:-64}" "${common[@]}" \
  --svg "$build/bench/soak_thread.svg" || rc=1
if command -v mpirun >/dev/null; then
  echo "== mpi backend, ${NP:-4} processes"
  /usr/bin/time -f "# wall %e s" mpirun --oversubscribe --bind-to none --mca btl self,vader \
    -np "${NP:-4}" "$exe" mpi "${common[@]}" --svg "$build/bench/soak_mpi.svg" || rc=1
else
  echo "== mpi backend skipped: no mpirun"
fi
echo "# curves: $build/bench/soak_thread.svg $build/bench/soak_mpi.svg"
exit $rc
