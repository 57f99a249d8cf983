#!/usr/bin/env bash
# The two quick-start commands of README.md:
#   bash tools/setup.sh demo   install what is missing, build, run the demo
#   bash tools/setup.sh test   install what is missing, build, run every test:
#                              the plain build, then (unless MESHPG_SANITIZE=0)
#                              the whole suite again under ASan+UBSan (clang)
#                              and the thread-backend, sync and C++ suites
#                              under TSan (clang), and a compile (no run)
#                              under gcc's ASan+UBSan and TSan; one summary
#                              line over all
#   bash tools/setup.sh bench  the same, plus python3-torch, then the issue-4
#                              sync benchmark (bench/run_sync.sh; its own
#                              environment variables apply)
# Environment: MESHPG_BUILD_DIR (default: build; the sanitizer builds of
# `test` go to the same path with -asan, -tsan, -gcc-asan and -gcc-tsan
# appended), MESHPG_SKIP_APT=1
# to never call apt-get, MESHPG_MESON_ARGS for extra `meson setup` arguments
# (all builds), MESHPG_SANITIZE=0 to skip the sanitizer builds of `test`
# (default 1: CI runs them).
set -euo pipefail

mode=${1:-}
case "$mode" in
  demo|test|build|bench) ;;
  *) echo "usage: bash tools/setup.sh demo|test|build|bench" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MESHPG_BUILD_DIR:-$root/build}
sanitize=${MESHPG_SANITIZE:-1}
case "$sanitize" in
  0|1) ;;
  *) echo "setup: MESHPG_SANITIZE must be 0 or 1, not '$sanitize'" >&2; exit 2 ;;
esac
[ "$mode" = test ] || sanitize=0

# phase TEXT: one line "== [HH:MM:SS +Ns] TEXT" (UTC, seconds since the
# script started), so that a CI log shows where its time goes
# (docs/testing.md, "Where CI's time goes").
phase() {
  echo "== [$(date -u +%H:%M:%S) +${SECONDS}s] $*"
}
phase "setup: start"

# Debian packages the build and the test suite need.
# cmake: tests/install builds a CMake consumer of the installed package.
# scdoc: builds the man pages (man/); man-db: tests/install renders them.
# libssl-dev: OpenSSL's libcrypto (HMAC-SHA256) for the rendezvous' job key.
packages=(gcc g++ meson ninja-build pkg-config libtomlplusplus-dev libhwloc-dev
          libssl-dev libcriterion-dev libopenmpi-dev openmpi-bin valgrind cmake scdoc man-db)
# iproute2 (ip) and procps (pkill, pgrep): the cluster suite's hosts
# (tests/cluster/cluster.sh: namespaces, veth links on a bridge).
if [ "$mode" = test ]; then packages+=(iproute2 procps); fi
# PyTorch (gloo) for the DDP column of the sync benchmark only.
if [ "$mode" = bench ]; then packages+=(python3-torch); fi
# clang and its runtimes (ASan, UBSan, TSan, libFuzzer) for the sanitizer
# builds of `test`.
if [ "$sanitize" = 1 ]; then packages+=(clang-14 libclang-rt-14-dev); fi

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

phase "setup: packages checked"
if [ ! -f "$build/build.ninja" ]; then
  # shellcheck disable=SC2086
  meson setup "$build" "$root" ${MESHPG_MESON_ARGS:-}
fi
phase "plain build: ninja -C $build"
ninja -C "$build"

# Open MPI refuses to run as root unless told it may (containers, CI).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

case "$mode" in
  build) ;;
  bench)
    "$root/bench/run_sync.sh" "$build"
    ;;
  demo)
    # The main job: 8 thread ranks train a small GPT tensor- (with sequence
    # parallelism), context- and data-parallel (sharded optimizer) on
    # meshpg's groups and sync, checked step for step against one process
    # (examples/gpt; docs/examples.md).  Exits non-zero on FAIL.
    "$build/examples/gpt/gpt" --mesh tp=2,cp=2,dp=2 --sp --shard --steps 300 \
      --svg "$build/gpt_loss.svg"
    ;;
  test)
    total_ok=0 total_fail=0 total_skip=0 status=0

    # run_suite DIR LABEL [meson test args...]: run meson test in DIR and add
    # its Ok / Fail+Timeout / Skipped counts to the totals.
    run_suite() {
      local dir=$1 label=$2 log rc ok fail timeout skipped
      shift 2
      phase "$label: meson test -C $dir $*"
      # Sanitizer builds write every report here (tests/meson.build).
      local reports=$dir/sanitizer-reports nrep=0 f
      rm -f "$reports"/report.*
      log=$(mktemp)
      set +e
      meson test -C "$dir" --print-errorlogs --num-processes 2 "$@" 2>&1 | tee "$log"
      rc=${PIPESTATUS[0]}
      set -e
      ok=$(sed -n 's/^Ok:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
      fail=$(sed -n 's/^Fail:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
      timeout=$(sed -n 's/^Timeout:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
      skipped=$(sed -n 's/^Skipped:[[:space:]]*\([0-9]*\).*/\1/p' "$log" | tail -n 1)
      rm -f "$log"
      ok=${ok:-0}; fail=$(( ${fail:-0} + ${timeout:-0} ))
      if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then fail=1; fi
      # A report may not change an exit status (a leak in a Criterion worker
      # after its test passed, in a rank, in a program a test runs): each
      # report file counts as one failure.
      for f in "$reports"/report.*; do
        [ -s "$f" ] || continue
        nrep=$(( nrep + 1 ))
        echo "== sanitizer report $f:"
        cat "$f"
      done
      if [ "$nrep" -gt 0 ]; then
        echo "== $label: $nrep sanitizer report(s) in $reports, counted as failures"
        fail=$(( fail + nrep )); rc=1
      fi
      total_ok=$(( total_ok + ok ))
      total_fail=$(( total_fail + fail ))
      total_skip=$(( total_skip + ${skipped:-0} ))
      if [ "$rc" -ne 0 ]; then status=1; fi
      phase "$label: tests done"
      return 0
    }

    # setup_san DIR SANITIZERS [meson setup args...]: configure (once) and
    # build a clang sanitizer build; a failure counts as one failed test.
    setup_san() {
      local dir=$1 san=$2
      shift 2
      phase "clang $san build: meson setup and ninja -C $dir"
      if [ ! -f "$dir/build.ninja" ]; then
        # b_lundef=false: clang links the sanitizer runtime into executables
        # only, so libmeshpg.so keeps undefined __asan_*/__tsan_* symbols.
        # shellcheck disable=SC2086
        if ! CC=clang-14 CXX=clang++-14 meson setup "$dir" "$root" \
             -Db_sanitize="$san" -Db_lundef=false -Dwerror=true "$@" \
             ${MESHPG_MESON_ARGS:-}; then
          echo "setup: meson setup of $dir (-Db_sanitize=$san) failed"
          total_fail=$(( total_fail + 1 )); status=1
          return 1
        fi
      fi
      if ! ninja -C "$dir" -j2; then
        echo "setup: building $dir (-Db_sanitize=$san) failed"
        total_fail=$(( total_fail + 1 )); status=1
        return 1
      fi
    }

    # gcc_san_compile DIR SANITIZERS REGEX [meson setup args...]: configure
    # (once) a gcc build with -Db_sanitize=SANITIZERS and -Werror, and
    # compile (no link) its objects whose path matches REGEX; a failure
    # counts as one failed test.
    gcc_san_compile() {
      local dir=$1 san=$2 filter=$3 objs
      shift 3
      phase "gcc $san compile: $dir (objects matching '$filter', -Werror)"
      if [ ! -f "$dir/build.ninja" ]; then
        # shellcheck disable=SC2086
        if ! CC=gcc CXX=g++ meson setup "$dir" "$root" -Db_sanitize="$san" \
             -Db_lundef=false -Dwerror=true "$@" ${MESHPG_MESON_ARGS:-} >/dev/null; then
          echo "setup: meson setup of $dir (gcc, -Db_sanitize=$san) failed"
          total_fail=$(( total_fail + 1 )); status=1
          return 1
        fi
      fi
      mapfile -t objs < <(ninja -C "$dir" -t targets all \
        | sed -n 's/^\([^:]*\.o\): .*/\1/p' | grep -E "$filter")
      if ! ninja -C "$dir" -j2 "${objs[@]}" >"$dir/compile.log" 2>&1; then
        grep -B2 -A12 -E 'error|FAILED' "$dir/compile.log" | head -n 80
        echo "setup: compiling $dir (gcc, -Db_sanitize=$san) failed: $dir/compile.log"
        total_fail=$(( total_fail + 1 )); status=1
        return 1
      fi
    }

    # 1. The plain build: every suite, valgrind included.
    run_suite "$build" "plain build"

    if [ "$sanitize" = 1 ]; then
      # 2. ASan + UBSan: the whole suite (fuzz targets included: clang
      # supports -fsanitize=fuzzer), valgrind and install excepted.  The
      # options and suppression files (tests/sanitizers/) come from
      # tests/meson.build and reach the mpirun ranks through its environment.
      if setup_san "$build-asan" address,undefined; then
        run_suite "$build-asan" "ASan+UBSan build" --timeout-multiplier 3
      fi
      # 3. TSan: the thread backend, the sync suites, the C++ tests, the GPT
      # example on thread ranks, the fault suite's thread ranks, and
      # the NCCL backend on the CUDA/NCCL test double with thread ranks
      # (host code against the double's stream executors), and the cluster
      # suite's torchrun-style jobs (processes on the double's socket
      # transport; its mpirun jobs skip there).  Open MPI is not
      # TSan-instrumented and would report its own progress engine, so this
      # build has no MPI backend: test_mpi, test_sync_mpi, the NCCL mpirun
      # worlds and the trainer's mpirun runs do not exist there (the two
      # builds above run them).  The NCCL tests on NVIDIA's libraries skip
      # without a GPU.
      phase "TSan build: -Dmpi=disabled: the MPI tests are skipped here (Open MPI is not TSan-instrumented)"
      if setup_san "$build-tsan" thread -Dmpi=disabled; then
        run_suite "$build-tsan" "TSan build" --timeout-multiplier 3 \
          --suite groups --suite sync --suite cpp --suite examples --suite faults \
          --suite cluster
      fi
      # 4. gcc's sanitizers, compile only (issue 51): gcc 12 warns where
      # clang does not (-Warray-bounds under -fsanitize=address, -Wtsan on
      # atomic_thread_fence), and users build with Debian's default
      # compiler.  What ships or a user builds from this tree compiles
      # under gcc with ASan+UBSan: the library (libmpg_*), the meshpg
      # program (tools/) and the examples (examples/); the library's objects
      # under gcc with TSan; -Werror, nothing linked or run (the suites run
      # in the clang builds above; docs/testing.md).  The tests and
      # benchmarks are not compiled here (issue 47, CI time: they were 262
      # of the 371 objects, 362 of 445 CPU-seconds): they ship to nobody, they
      # compile under gcc -Werror in the plain build, and under both
      # sanitizers with clang, where they run.  A failure counts as one
      # failed test.
      gcc_san_compile "$build-gcc-asan" address,undefined '^(libmpg_|tools/|examples/)' \
        && gcc_san_compile "$build-gcc-tsan" thread '^libmpg_' -Dmpi=disabled \
        && phase "gcc sanitizer compile: ok"
    else
      echo "== MESHPG_SANITIZE=0: the ASan+UBSan and TSan builds are skipped"
    fi

    phase "done"
    echo "${total_ok} passed, ${total_fail} failed, ${total_skip} skipped"
    exit "$status"
    ;;
esac
