#!/usr/bin/env bash
# Run one libFuzzer target for a bounded time on a copy of its seeds.
#   run_fuzz.sh TARGET SEED_DIR [SEED_FILE...]
# The corpus is a temporary copy of SEED_DIR (hand-written seeds and the
# regression inputs of earlier crashes) and the SEED_FILEs, so the source
# tree is never written.  Every seed is replayed first, then the target is
# fuzzed for MESHPG_FUZZ_SECONDS (default 20; 0: replay only) seconds with
# one worker.
# Bounds: -rss_limit_mb (MESHPG_FUZZ_RSS_MB, default 2048), -timeout per
# input (10 s), and timeout(1) around the whole run.  On a crash, leak or
# timeout the temporary directory is kept and its path printed: the input
# is in its artifacts/ folder; add it to SEED_DIR as a regression input.
# SEED_DIR.dict, when there is one, is passed as libFuzzer's -dict.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: run_fuzz.sh TARGET SEED_DIR [SEED_FILE...]" >&2
  exit 2
fi
target=$1
seeds=$2
shift 2
secs=${MESHPG_FUZZ_SECONDS:-20}
rss=${MESHPG_FUZZ_RSS_MB:-2048}
case "$secs" in ''|*[!0-9]*) echo "run_fuzz.sh: MESHPG_FUZZ_SECONDS=\"$secs\": expected seconds" >&2; exit 2 ;; esac

work=$(mktemp -d "${TMPDIR:-/tmp}/meshpg-fuzz.XXXXXX")
mkdir "$work/corpus" "$work/artifacts" "$work/tmp"
if [ -d "$seeds" ]; then cp -R "$seeds"/. "$work/corpus/"; fi
for f in "$@"; do cp "$f" "$work/corpus/"; done

# The targets make their temporary files below $work/tmp.
export TMPDIR=$work/tmp
# Sanitizers: stop at the first report.  LeakSanitizer reads the project's
# suppressions of third-party leaks when there are any.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# A smaller quarantine than ASan's 256 MiB: topo_xml's hwloc topologies
# otherwise grow a 150 s run past 1.4 GiB of RSS, towards -rss_limit_mb.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=32
# LeakSanitizer: the project's suppressions of third-party leaks
# (tests/sanitizers/lsan.supp) and the fuzz suite's (tests/fuzz/lsan.supp),
# joined, since LSAN_OPTIONS takes one file.
root=${MESHPG_SOURCE_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
cat "$root/tests/sanitizers/lsan.supp" "$root/tests/fuzz/lsan.supp" \
  > "$work/lsan.supp" 2>/dev/null || true
export LSAN_OPTIONS=suppressions=$work/lsan.supp:print_suppressions=0

echo "run_fuzz.sh: $(basename "$target"): $(find "$work/corpus" -type f | wc -l) seeds, ${secs}s"
rc=0
# MESHPG_FUZZ_SECONDS=0 replays the seeds only (libFuzzer reads
# -max_total_time=0 as "no limit").
if [ "$secs" -eq 0 ]; then limit=-runs=0; else limit=-max_total_time=$secs; fi
# A dictionary next to the seed folder (tests/fuzz/<target>.dict).
dict=()
if [ -f "${seeds%/}.dict" ]; then dict=(-dict="${seeds%/}.dict"); fi
timeout -k 30 $((secs + 300)) "$target" \
  "$limit" -rss_limit_mb="$rss" -timeout=10 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1 ${dict[@]+"${dict[@]}"} \
  "$work/corpus" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "run_fuzz.sh: $(basename "$target") failed (exit $rc); inputs kept in $work/artifacts:" >&2
  ls -l "$work/artifacts" >&2 || true
  exit 1
fi
rm -rf "$work"
