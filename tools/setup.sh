#!/usr/bin/env bash
# The two quick-start commands of README.md:
#   bash tools/setup.sh demo   install what is missing, build, run the demo
#   bash tools/setup.sh test   install what is missing, build, run every test
#   bash tools/setup.sh bench  the same, plus python3-torch, then the issue-4
#                              sync benchmark (bench/run_sync.sh; its own
#                              environment variables apply)
# Environment: MESHPG_BUILD_DIR (default: build), MESHPG_SKIP_APT=1 to never
# call apt-get, MESHPG_MESON_ARGS for extra `meson setup` arguments.
set -euo pipefail

mode=${1:-}
case "$mode" in
  demo|test|build|bench) ;;
  *) echo "usage: bash tools/setup.sh demo|test|build|bench" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MESHPG_BUILD_DIR:-$root/build}

# Debian packages the build and the test suite need.
# cmake: tests/install builds a CMake consumer of the installed package.
packages=(gcc g++ meson ninja-build pkg-config libtomlplusplus-dev libhwloc-dev
          libcriterion-dev libopenmpi-dev openmpi-bin valgrind cmake)
# PyTorch (gloo) for the DDP column of the sync benchmark only.
if [ "$mode" = bench ]; then packages+=(python3-torch); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ] && [ "${MESHPG_SKIP_APT:-0}" != 1 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -f "$build/build.ninja" ]; then
  # shellcheck disable=SC2086
  meson setup "$build" "$root" ${MESHPG_MESON_ARGS:-}
fi
ninja -C "$build"

# Open MPI refuses to run as root unless told it may (containers, CI).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

case "$mode" in
  build) ;;
  bench)
    "$root/bench/run_sync.sh" "$build"
    ;;
  demo)
    # The main job: 8 simulated ranks train a tp/cp/dp-parallel MLP with
    # gradients synchronised over dp_cp, checked against one process.
    "$build/tools/meshpg" plan "$root/examples/seed.toml" --rank 5
    echo
    "$build/tools/meshpg" sim "$root/examples/seed.toml" --steps 50
    ;;
  test)
    log=$(mktemp)
    set +e
    meson test -C "$build" --print-errorlogs --num-processes 2 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    ok=$(sed -n 's/^Ok:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    fail=$(sed -n 's/^Fail:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    timeout=$(sed -n 's/^Timeout:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    skipped=$(sed -n 's/^Skipped:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    rm -f "$log"
    ok=${ok:-0}; fail=$(( ${fail:-0} + ${timeout:-0} ))
    if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then fail=1; fi
    echo "${ok} passed, ${fail} failed, ${skipped:-0} skipped"
    exit "$rc"
    ;;
esac
