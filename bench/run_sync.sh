#!/usr/bin/env bash
# run_sync.sh - the issue-4 gradient-sync benchmarks side by side, one table.
#
#   bench/run_sync.sh [BUILD_DIR] [PARAMS]
#
# BUILD_DIR (default: build) holds bench/bench_sync_mpi; PARAMS defaults to
# gpt-small.params next to this script (bench/gpt-medium.params works too,
# but needs about 4 x 4 GB for the C program and 4 x 8 GB for DDP; both
# lists are described in bench/README.md).  Run from the repository root (or
# anywhere: paths are resolved from this script).
#
# One run does ROUNDS (3) rounds, each with the same mpirun line
#   mpirun --oversubscribe --bind-to none --mca btl self,vader -np $NP
# running, in turn (so a noisy neighbour hits every program alike):
#   1. bench_sync_mpi PARAMS: (a) meshpg sync, (b) flat all-reduce, (c) the
#      naive per-tensor recipe (and (r)/(i), MPI in the same process, when
#      MODES names them), interleaved; then the overlap with busy CPU
#      compute (o), polling MPI (p), device-like compute where the host
#      thread sleeps (g), and no overlap (n), with T_comm = median of (a)
#      from this same run;
#   2. bench_raw_mpi PARAMS, a process of its own (issue 13): (R) raw
#      MPI_Allreduce in place on one buffer allocated once, + divide; (L)
#      the naive per-tensor loop on raw MPI;
#   3. bench/gloo_flat.py (F): torch.distributed.all_reduce (gloo) on one
#      flat tensor, + divide;  4. bench/ddp_bench.py (d): DDP sync time;
#      both under /usr/bin/python3 (Debian python3-torch).
# It prints every RESULT line and one table: per mode the median over the
# rounds of each round's median, with the spread (lowest..highest round
# median), faults per step, GB/s; the best reference (the fastest of R, L,
# c and F) and the goals as ratios against it: (a) <= 1.00 x best,
# (d)/(a) >= 2, exposed in (g) <= floor + 5 points.
#
# Environment: NP (4), ROUNDS (3), ITERS (20), WARMUP (3), MODES
# (a,b,c,o,g,n; add r,i,p,s,1 for more profile rows), MASTER_PORT (29500 +
# pid % 1000), PYTHON (/usr/bin/python3), SKIP_DDP=1 to leave out (d),
# SKIP_GLOO=1 to leave out (F), SKIP_RAW=1 to leave out (R) and (L),
# SKIP_WAKEUP=1 to leave out bench_wakeup (run with (g): what one host
# wake-up costs busy cores here, which explains part of (g)'s exposure),
# DDP_TIMEOUT (1800 s, a guard
# against a hung torch teardown), MPIRUN_EXTRA (more mpirun arguments).
# Exit status: 0 when every program ran (a missed goal is reported as MISS,
# not an error: timings depend on the machine), 1 when one failed, 2 on a
# usage error.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-build}
params=${2:-$here/gpt-small.params}
[[ $build = /* ]] || build="$root/$build"
if [[ $# -gt 2 || ${1:-} = -h || ${1:-} = --help ]]; then
  sed -n '2,/^[^#]/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'
  [[ ${1:-} = -h || ${1:-} = --help ]] && exit 0 || exit 2
fi
exe="$build/bench/bench_sync_mpi"
if [[ ! -x $exe ]]; then
  echo "run_sync.sh: $exe not found: build first (meson setup $build && ninja -C $build)" >&2
  exit 2
fi
if [[ ! -r $params ]]; then
  echo "run_sync.sh: cannot read $params" >&2
  exit 2
fi

NP=${NP:-4}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-3}
MODES=${MODES:-a,b,c,o,g,n}
PYTHON=${PYTHON:-/usr/bin/python3}
MASTER_PORT=${MASTER_PORT:-$((29500 + $$ % 1000))}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2206
extra=(${MPIRUN_EXTRA:-})
mpirun_cmd=(mpirun --oversubscribe --bind-to none --mca btl "self,vader" -np "$NP" "${extra[@]}")
raw="$build/bench/bench_raw_mpi"
wake="$build/bench/bench_wakeup"

out=$(mktemp -d "${TMPDIR:-/tmp}/run_sync.XXXXXX")
trap 'rm -rf "$out"' EXIT

cores=$(nproc)
echo "# run_sync.sh: $(date -u +%FT%TZ) on $(hostname): $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(mpirun --version 2>/dev/null | head -1); $NP processes on $cores cores$([[ $NP -gt $cores ]] && echo ' (oversubscribed)')"
echo "# params: $params; $ROUNDS rounds of $ITERS timed iterations after $WARMUP warm-up"

# run NAME OUTFILE COMMAND...: run it, show its output, fail loudly.
run() {
  local name=$1 file=$2
  shift 2
  echo "# + $*"
  if ! "$@" >"$file" 2>"$file.err"; then
    cat "$file" "$file.err" >&2
    echo "run_sync.sh: $name failed" >&2
    exit 1
  fi
  cat "$file"
}
py_env=(-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$MASTER_PORT" -x GLOO_SOCKET_IFNAME=lo)
for ((r = 1; r <= ROUNDS; r++)); do
  echo "# round $r of $ROUNDS: load $(cut -d' ' -f1-3 /proc/loadavg)"
  run bench_sync_mpi "$out/c.$r.txt" "${mpirun_cmd[@]}" "$exe" "$params" --iters "$ITERS" \
    --warmup "$WARMUP" --modes "$MODES"
  if [[ ${SKIP_WAKEUP:-0} != 1 && -x $wake && ,$MODES, = *,g,* ]]; then
    # What (g)'s host wake-ups cost: NP sleeping threads against the
    # progress threads' busy cores (at most one per core).
    run bench_wakeup "$out/w.$r.txt" "$wake" --workers "$((NP < cores ? NP : cores))" \
      --sleepers "$NP" --seconds 0.3
  fi
  if [[ ${SKIP_RAW:-0} != 1 && -x $raw ]]; then
    run bench_raw_mpi "$out/r.$r.txt" "${mpirun_cmd[@]}" "$raw" "$params" "$ITERS" "$WARMUP"
  fi
  if [[ ${SKIP_GLOO:-0} != 1 ]]; then
    run gloo_flat.py "$out/f.$r.txt" timeout "${DDP_TIMEOUT:-1800}" "${mpirun_cmd[@]}" \
      "${py_env[@]}" "$PYTHON" "$here/gloo_flat.py" "$params" --iters "$ITERS" --warmup "$WARMUP"
  fi
  if [[ ${SKIP_DDP:-0} != 1 ]]; then
    run ddp_bench.py "$out/d.$r.txt" timeout "${DDP_TIMEOUT:-1800}" "${mpirun_cmd[@]}" \
      "${py_env[@]}" "$PYTHON" "$here/ddp_bench.py" "$params" --iters "$ITERS" --warmup "$WARMUP"
  fi
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# The table (python3 of the system: only the standard library).
"$PYTHON" - "$NP" "$cores" "$params" "$ROUNDS" "$out" <<'PY'
import os
import statistics
import sys
np_, cores, params, rounds, out = sys.argv[1:6]
runs = []  # per round: {mode: {key: value}}
for r in range(1, int(rounds) + 1):
    R = {}
    for f in ("c", "r", "f", "d", "w"):
        path = os.path.join(out, "%s.%d.txt" % (f, r))
        if os.path.exists(path):
            for line in open(path):
                if line.startswith("RESULT "):
                    x = line.split()
                    R[x[1]] = dict(y.split("=", 1) for y in x[2:])
    runs.append(R)
modes = sorted({m for R in runs for m in R})


def vals(m, k="median_s"):
    v = []
    for R in runs:
        try:
            v.append(float(R[m][k]))
        except (KeyError, ValueError):
            pass
    return v


def g(m, k="median_s"):
    """Median over the rounds of a round's figure."""
    v = vals(m, k)
    return statistics.median(v) if v else None


def spread(m, k="median_s"):
    v = vals(m, k)
    return (min(v), max(v)) if v else (None, None)


def ms(x):
    return x * 1e3


rows = [
    ("a", "meshpg mpg_sync: begin + mark_ready x N (backward order) + finish"),
    ("b", "flat mpg_all_reduce avg, one contiguous buffer (ours)"),
    ("c", "ref: naive per-tensor mpg_all_reduce sum + divide loop"),
    ("R", "ref: raw MPI_Allreduce in place, own process, + divide"),
    ("L", "ref: naive per-tensor loop on raw MPI_Allreduce, own process"),
    ("F", "ref: gloo flat all_reduce through torch, one tensor, + divide"),
    ("d", "ref: PyTorch DDP gloo, bucket_cap_mb=25: backward - no_sync"),
    ("r", "raw MPI_Allreduce in the C benchmark's process + divide"),
    ("i", "raw MPI_Iallreduce + MPI_Wait in that process + divide"),
    ("s", "profile: mpg_sync with op sum (no divide pass)"),
    ("1", "profile: mpg_sync with one bucket"),
]
by = next((float(R[m]["bytes"]) for R in runs for m in R if "bytes" in R[m]), 0.0)
print()
print("== sync benchmark: %s, %.2f MB f32, Open MPI, np=%s on %s cores; median of %s "
      "rounds' medians (spread: lowest..highest round) =="
      % (os.path.basename(params), by / 1e6, np_, cores, rounds))
print("%-4s%-64s%10s %-15s%8s%9s  %s" % ("", "mode", "median ms", "spread ms", "GB/s",
                                          "flt/step", "extra"))
for m, desc in rows:
    t = g(m)
    if t is None:
        continue
    lo, hi = spread(m)
    ex = []
    if m in ("R", "r", "i"):
        ex.append("allreduce %.1f + divide %.1f ms" % (ms(g(m, "allreduce_s")),
                                                     ms(g(m, "divide_s"))))
    if m == "d":
        ex.append("backward %.1f - no_sync %.1f ms" % (ms(g(m, "ddp_backward_s")),
                                                      ms(g(m, "nosync_backward_s"))))
    fl = g(m, "faults")
    print("(%s) %-64s%10.2f %6.1f..%-7.1f%8.3f%9s  %s"
          % (m, desc, ms(t), ms(lo), ms(hi), by / t / 1e9,
             "%.0f" % fl if fl is not None else "n/a", ", ".join(ex)))
for m, desc in (("o", "overlap: busy CPU compute T_comm, marks as it goes"),
                ("p", "profile: o, compute polls MPI progress every 100 us"),
                ("g", "overlap, compute on a device: host thread sleeps"),
                ("n", "no overlap: compute T_comm, then mark all ready, finish")):
    if g(m) is None:
        continue
    lo, hi = spread(m, "exposed_pct")
    print("(%s) %-64s%10.2f %6.1f..%-7.1f%8s%9.0f  T_comm %.1f ms, exposed %.1f%% "
          "(spread %.1f..%.1f %%)"
          % (m, desc, ms(g(m)), ms(spread(m)[0]), ms(spread(m)[1]), "", g(m, "faults"),
             ms(g(m, "t_comm_s")), g(m, "exposed_pct"), lo, hi))
print()


def verdict(ok):
    return "PASS" if ok else "MISS"


a, d = g("a"), g("d")
refs = [(g(m), m) for m in ("R", "L", "c", "F") if g(m) is not None]
if a and refs:
    best, bm = min(refs)
    print("best reference: (%s) %.2f ms" % (bm, ms(best)))
    r = a / best
    print("(a)/best time       = %7.3f    goal <= 1.00   %s   (per reference: %s)"
          % (r, verdict(r <= 1.0), ", ".join("%s %.3f" % (m, a / t) for t, m in refs)))
if a and d:
    r = d / a
    print("(d)/(a) time        = %7.3f    goal >= 2      %s" % (r, verdict(r >= 2.0)))
if a and g("b"):
    print("(a)/(b) bandwidth   = %7.3f    (against our own flat all-reduce)" % (g("b") / a))
for m, what in (("g", "overlap, device compute (g)"), ("o", "overlap, busy CPU (o)")):
    if g(m) is not None:
        e, fl = g(m, "exposed_pct"), g(m, "bound_pct")
        line = "exposed, %-27s = %5.1f %%" % (what, e)
        if m == "g":
            line += "  goal <= floor + 5 = %.1f %%   %s" % (fl + 5, verdict(e <= fl + 5))
        print(line + "   (floor: the last-ready tensor holds %.1f %% of the bytes)" % fl)
        w, c = g(m, "wakeups"), g("wakeup", "cost_us")
        if m == "g" and w is not None and c is not None:
            # The wake-ups' core time, spread over the busy cores (work
            # that any rank can take over), or summed (a ring: every step
            # waits for every rank, so one rank's stall stalls them all).
            busy = min(int(np_), int(cores))
            total = int(np_) * w * c * 1e-6
            y1 = 100.0 * total / busy / g(m, "t_comm_s")
            y2 = 100.0 * total / g(m, "t_comm_s")
            print("  (g) host wake-ups: %.0f per rank per step x %.1f us of core time each "
                  "when the cores are busy (bench_wakeup) x %s ranks = %.2f ms: floor + "
                  "their share of T_comm = %.1f %% spread over %d cores, %.1f %% if every "
                  "rank waits for every stall (a ring)"
                  % (w, c, np_, ms(total), fl + y1, busy, fl + y2))
if g("n") is not None:
    print("exposed, no overlap = %7.1f %%" % g("n", "exposed_pct"))
PY
