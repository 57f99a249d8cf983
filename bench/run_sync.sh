#!/usr/bin/env bash
# run_sync.sh - the issue-4 gradient-sync benchmarks side by side, beside the
# physical floor (issue 23): one table per np, then a summary.
#
#   bench/run_sync.sh [BUILD_DIR] [PARAMS]
#
# BUILD_DIR (default: build) holds bench/bench_sync_mpi and bench/bench_floor;
# PARAMS defaults to gpt-small.params next to this script
# (bench/gpt-medium.params works too, but needs about np x 4 GB for each C
# program and np x 8 GB for DDP; both lists are described in
# bench/README.md).  Run from the repository root (or anywhere: paths are
# resolved from this script).
#
# For every np of NPS in turn, one run of ROUNDS (3) rounds, each with the
# same mpirun line
#   mpirun --oversubscribe --bind-to none --mca btl self,vader -np <np>
# running, in turn (so a noisy neighbour hits every program alike):
#   1. bench_sync_mpi PARAMS: (a) meshpg sync, (b) flat all-reduce, (c) the
#      naive per-tensor recipe (and (r)/(i), MPI in the same process, when
#      MODES names them), interleaved; then the overlap with busy CPU
#      compute (o), polling MPI (p), device-like compute where the host
#      thread sleeps (g), and no overlap (n), with T_comm = median of (a)
#      from this same run;
#   2. bench_floor PARAMS --threads <np> (M), the physical floor, one
#      process, not under mpirun: np threads, each copying its own S-byte
#      buffer into another S-byte buffer of its own, all at once (S: the
#      f32 bytes of PARAMS, the bytes (a) syncs); buffers allocated once
#      and written before timing (no page faults), threads not pinned (the
#      ranks are not either); an iteration runs from the common start (a
#      barrier) to the end of the last thread; every iteration tries each
#      copy loop (memcpy, a vector loop, rep movsb, non-temporal stores);
#      the floor is the fastest the machine did the copy: the best
#      iteration of the fastest loop, over all the rounds (issue 34);
#   3. bench_raw_mpi PARAMS, a process of its own (issue 13): (R) raw
#      MPI_Allreduce in place on one buffer allocated once, + divide; (L)
#      the naive per-tensor loop on raw MPI;
#   4. bench/gloo_flat.py (F): torch.distributed.all_reduce (gloo) on one
#      flat tensor, + divide;  5. bench/ddp_bench.py (d): DDP sync time;
#      both under /usr/bin/python3 (Debian python3-torch).  Without
#      PyTorch (PYTHON cannot find the torch module) one line says so and
#      how to get it, (F) and (d) are skipped as with SKIP_GLOO=1
#      SKIP_DDP=1, and everything else runs; what needs them prints
#      "n/a (no torch)".
# After each np's rounds, once (issue 34): bench_sync_gather PARAMS (G),
# shard mode's parameter gather in shared memory against the backend's
# gather (MESHPG_SHM=0), MPI_Allgather and its floor (np ranks each
# copying (np - 1) / np of the bytes at once), with --repeat ROUNDS; its
# rows, then one line "gather (G): shm /floor = X.XX" (goal <= 1.30 at np
# 2, with PASS or MISS) and its ratio to the best MPI.  GATHER_METHODS
# (default shm,backend,mpi,floor) is passed as its --methods (leave out
# backend for gpt-medium: each method's buffers are the params' bytes per
# rank); SKIP_GATHER=1 leaves it out.
# Every program gets ITERS timed iterations after WARMUP warm-up ones.
# Per np it prints every RESULT line and one table: per mode the median
# over the rounds of each round's median, with the spread (lowest..highest
# round median), faults per step, GB/s (bytes S over the time; for (M) per
# thread, and its best, the floor, in the extra column); the best reference (the fastest of R, L, c and F) and the goals
# as ratios, each with PASS or MISS:
#   (a)/best time       (a) <= 1.00 x the best reference;
#   (a)/floor = X.XX goal <= 1.00   (a) (its median) within the floor (M)
#                       of that np (its best); a ratio below 0.90 adds a
#                       WARNING line: (a) beat the physical floor, so the
#                       floor is wrong;
#   (d)/(a) time        >= 3 at np >= 4 (so at np 4 and 8), >= 2 below;
#   exposed, overlap, device compute (g) <= floor + 5 points, where this
#                       floor is the exposure's: the share of the bytes in
#                       the last-ready tensor (not the copy floor (M)).
# Then a summary, one row per np: np, (a) ms, floor ms, (a)/floor, (d)/(a)
# and its goal, exposed (g) and its goal; and, when np 2 and np 8 both ran,
# "(a)/floor at np 8 vs np 2" (goal: no worse at np 8 than at np 2); a
# WARNING line for every np whose (a)/floor is below 0.90.
#
# Environment: NPS (the np values to run, space- or comma-separated;
# default "2 4 8" when nproc >= 8, "2 4" when nproc >= 4, else "2"), NP
# (one np: the same as NPS=NP, for older command lines; set NP or NPS, not
# both), ROUNDS (3), ITERS (20), WARMUP (3), MODES (a,b,c,o,g,n; add
# r,i,p,s,1 for more profile rows), MASTER_PORT (29500 + pid % 1000),
# PYTHON (/usr/bin/python3), SKIP_DDP=1 to leave out (d), SKIP_GLOO=1 to
# leave out (F), SKIP_RAW=1 to leave out (R) and (L), SKIP_GATHER=1 to leave
# out (G), GATHER_METHODS (above), DDP_TIMEOUT (1800 s,
# a guard against a hung torch teardown), MPIRUN_EXTRA (more mpirun
# arguments).  The floor (M) always runs.
# Exit status: 0 when every program ran (a missed goal is reported as MISS,
# not an error: timings depend on the machine), 1 when one failed, 2 on a
# usage error (a bad NP or NPS included).
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
floor="$build/bench/bench_floor"
for x in "$exe" "$floor"; do
  if [[ ! -x $x ]]; then
    echo "run_sync.sh: $x not found: build first (meson setup $build && ninja -C $build)" >&2
    exit 2
  fi
done
if [[ ! -r $params ]]; then
  echo "run_sync.sh: cannot read $params" >&2
  exit 2
fi

cores=$(nproc)
if [[ -n ${NP:-} && -n ${NPS:-} ]]; then
  echo "run_sync.sh: set NP (one np) or NPS (a list), not both" >&2
  exit 2
fi
if [[ -n ${NP:-} ]]; then
  NPS=$NP
elif [[ -z ${NPS:-} ]]; then
  if ((cores >= 8)); then NPS="2 4 8"; elif ((cores >= 4)); then NPS="2 4"; else NPS=2; fi
fi
read -r -a nps <<<"${NPS//,/ }"
if [[ ${#nps[@]} -eq 0 ]]; then
  echo "run_sync.sh: NPS is empty" >&2
  exit 2
fi
for np in "${nps[@]}"; do
  if [[ ! $np =~ ^[1-9][0-9]*$ ]]; then
    echo "run_sync.sh: NP/NPS: '$np' is not a positive whole number" >&2
    exit 2
  fi
done
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-3}
MODES=${MODES:-a,b,c,o,g,n}
PYTHON=${PYTHON:-/usr/bin/python3}
if ! "$PYTHON" -c 'import sys' >/dev/null 2>&1; then
  echo "run_sync.sh: PYTHON=$PYTHON does not run (the tables need a python3)" >&2
  exit 2
fi
# Without PyTorch, skip its references (F) and (d): found once, here.
no_torch=0
if [[ ${SKIP_GLOO:-0} != 1 || ${SKIP_DDP:-0} != 1 ]] &&
  ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' \
    >/dev/null 2>&1; then
  no_torch=1
  SKIP_GLOO=1
  SKIP_DDP=1
fi
# Why (F) and (d) are missing, for the tables: "-" when they run.
why_f=-
why_d=-
if ((no_torch)); then
  why_f="no torch" why_d="no torch"
else
  [[ ${SKIP_GLOO:-0} = 1 ]] && why_f="SKIP_GLOO=1"
  [[ ${SKIP_DDP:-0} = 1 ]] && why_d="SKIP_DDP=1"
fi
MASTER_PORT=${MASTER_PORT:-$((29500 + $$ % 1000))}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2206
extra=(${MPIRUN_EXTRA:-})
raw="$build/bench/bench_raw_mpi"
gather="$build/bench/bench_sync_gather"

out=$(mktemp -d "${TMPDIR:-/tmp}/run_sync.XXXXXX")
trap 'rm -rf "$out"' EXIT

echo "# run_sync.sh: $(date -u +%FT%TZ) on $(hostname): $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(mpirun --version 2>/dev/null | head -1); np ${nps[*]} on $cores cores"
echo "# params: $params; per np $ROUNDS rounds of $ITERS timed iterations after $WARMUP warm-up"
if ((no_torch)); then
  echo "run_sync.sh: PyTorch is not installed (no torch module for $PYTHON): the torch" \
    "references (F) and (d) are skipped; apt-get install python3-torch to get them"
fi

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

# The tables (python3 of the system: only the standard library).
#   table NP CORES PARAMS ROUNDS DIR SUMMARY WHY_F WHY_D: one np's table and
#     goals from DIR/<program>.<round>.txt; appends its summary row (JSON) to
#     SUMMARY; WHY_F, WHY_D: why (F), (d) did not run ("no torch",
#     "SKIP_DDP=1", ...), "-" when they ran;
#   summary CORES PARAMS ROUNDS SUMMARY: the summary, one row per np.
read -r -d '' tables <<'PY'
import json
import os
import statistics
import sys


def verdict(ok):
    return "PASS" if ok else "MISS"


def ms(x):
    return x * 1e3


# A ratio to the floor below this: the measured thing beat the physical
# floor, so the floor is wrong.
FLOOR_WARN = 0.90


def floor_warning(what, r):
    return ("WARNING: %s = %.2f < %.2f: %s beat the physical floor (M), so the floor is "
            "wrong (too slow): check bench_floor's copy loops (--loops) and its best against "
            "a plain memcpy of the same bytes" % (what, r, FLOOR_WARN, what.split("/")[0]))


def ddp_goal(np_):
    """(d)/(a) must reach 3 from np 4 on (np 4 and 8), 2 below."""
    return 3.0 if np_ >= 4 else 2.0


def table(np_, cores, params, rounds, out, summary, why_f, why_d):
    why = {"F": None if why_f == "-" else why_f, "d": None if why_d == "-" else why_d}
    runs = []  # per round: {mode: {key: value}}
    for r in range(1, rounds + 1):
        R = {}
        for f in ("c", "m", "r", "f", "d"):
            path = os.path.join(out, "%s.%d.txt" % (f, r))
            if os.path.exists(path):
                for line in open(path):
                    if line.startswith("RESULT "):
                        x = line.split()
                        R[x[1]] = dict(y.split("=", 1) for y in x[2:])
        runs.append(R)

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

    rows = [
        ("a", "meshpg mpg_sync: begin + mark_ready x N (backward order) + finish"),
        ("b", "flat mpg_all_reduce avg, one contiguous buffer (ours)"),
        ("c", "ref: naive per-tensor mpg_all_reduce sum + divide loop"),
        ("R", "ref: raw MPI_Allreduce in place, own process, + divide"),
        ("L", "ref: naive per-tensor loop on raw MPI_Allreduce, own process"),
        ("F", "ref: gloo flat all_reduce through torch, one tensor, + divide"),
        ("d", "ref: PyTorch DDP gloo, bucket_cap_mb=25: backward - no_sync"),
        ("M", "floor: np threads each copy S bytes of their own, at once"),
        ("r", "raw MPI_Allreduce in the C benchmark's process + divide"),
        ("i", "raw MPI_Iallreduce + MPI_Wait in that process + divide"),
        ("s", "profile: mpg_sync with op sum (no divide pass)"),
        ("1", "profile: mpg_sync with one bucket"),
    ]
    by = next((float(R[m]["bytes"]) for R in runs for m in R if "bytes" in R[m]), 0.0)
    print()
    print("== sync benchmark: %s, %.2f MB f32, Open MPI, np=%d on %d cores; median of %d "
          "rounds' medians (spread: lowest..highest round) =="
          % (os.path.basename(params), by / 1e6, np_, cores, rounds))
    print("%-4s%-64s%10s %-15s%8s%9s  %s" % ("", "mode", "median ms", "spread ms", "GB/s",
                                              "flt/step", "extra"))
    for m, desc in rows:
        t = g(m)
        if t is None:
            if why.get(m):
                print("(%s) %-64s%10s  (%s)" % (m, desc, "n/a", why[m]))
            continue
        lo, hi = spread(m)
        ex = []
        if m in ("R", "r", "i"):
            ex.append("allreduce %.1f + divide %.1f ms" % (ms(g(m, "allreduce_s")),
                                                         ms(g(m, "divide_s"))))
        if m == "d":
            ex.append("backward %.1f - no_sync %.1f ms" % (ms(g(m, "ddp_backward_s")),
                                                          ms(g(m, "nosync_backward_s"))))
        if m == "M":
            fb, floop = floor_best(runs)
            ex.append("GB/s per thread; floor = best %.2f ms (%s, %.2f GB/s per thread); "
                      "own copy of the slowest..fastest thread %.2f..%.2f GB/s, %.2f GB/s "
                      "in all" % (ms(fb), floop, by / fb / 1e9, g(m, "thread_gbps_min"),
                                  g(m, "thread_gbps_max"), g(m, "gbps_total")))
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
              % (m, desc, ms(g(m)), ms(spread(m)[0]), ms(spread(m)[1]), "",
                 g(m, "faults"), ms(g(m, "t_comm_s")), g(m, "exposed_pct"), lo, hi))
    print()

    a, d = g("a"), g("d")
    fm, floop = floor_best(runs)
    row = {"np": np_, "a": a, "floor": fm, "a_floor": None, "d_a": None,
           "d_goal": ddp_goal(np_), "g": None, "g_goal": None}
    refs = [(g(m), m) for m in ("R", "L", "c", "F") if g(m) is not None]
    if a and refs:
        best, bm = min(refs)
        print("best reference: (%s) %.2f ms" % (bm, ms(best)))
        r = a / best
        per = ["%s %.3f" % (m, a / t) for t, m in refs]
        if why["F"] and g("F") is None:
            per.append("F n/a (%s)" % why["F"])
        print("(a)/best time       = %7.3f    goal <= 1.00   %s   (per reference: %s)"
              % (r, verdict(r <= 1.0), ", ".join(per)))
    if a and fm:
        print("floor (M): %d threads x %.2f MB copied at once, the best of %d rounds: %.2f ms "
              "with %s, %.2f GB/s per thread (median of the rounds' medians %.2f ms)"
              % (np_, by / 1e6, rounds, ms(fm), floop, by / fm / 1e9, ms(g("M"))))
        r = row["a_floor"] = a / fm
        print("(a)/floor = %.2f goal <= 1.00   %s" % (r, verdict(r <= 1.0)))
        if r < FLOOR_WARN:
            print(floor_warning("(a)/floor", r))
        shm = g("a", "shm_buffers")
        if shm is not None:
            print("(a) path: %s" % ("node-local shared memory (one pass)" if shm > 0 else
                                    "the MPI backend's collectives (MESHPG_SHM=0?)"))
    if a and d:
        r = row["d_a"] = d / a
        need = ddp_goal(np_)
        print("(d)/(a) time        = %7.3f    goal >= %-5g  %s" % (r, need, verdict(r >= need)))
    elif a and why["d"]:
        row["d_why"] = why["d"]
        print("(d)/(a) time        =     n/a    goal >= %-5g  (%s)" % (ddp_goal(np_), why["d"]))
    if a and g("b"):
        print("(a)/(b) bandwidth   = %7.3f    (against our own flat all-reduce)" % (g("b") / a))
    for m, what in (("g", "overlap, device compute (g)"), ("o", "overlap, busy CPU (o)")):
        if g(m) is not None:
            e, fl = g(m, "exposed_pct"), g(m, "bound_pct")
            line = "exposed, %-27s = %5.1f %%" % (what, e)
            if m == "g":
                line += "  goal <= floor + 5 = %.1f %%   %s" % (fl + 5, verdict(e <= fl + 5))
                row["g"], row["g_goal"] = e, fl + 5
            print(line + "   (floor: the last-ready tensor holds %.1f %% of the bytes)" % fl)
    if g("n") is not None:
        print("exposed, no overlap = %7.1f %%" % g("n", "exposed_pct"))
    with open(summary, "a") as f:
        f.write(json.dumps(row) + "\n")


def summary(cores, params, rounds, path):
    rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    if not rows:
        return

    def num(x, fmt):
        return fmt % x if x is not None else "n/a"

    print()
    print("== summary: %s, np %s on %d cores; median of %d rounds' medians =="
          % (os.path.basename(params), " ".join(str(r["np"]) for r in rows), cores, rounds))
    print("%4s %10s %10s  %-16s %-22s %-12s %s"
          % ("np", "(a) ms", "floor ms", "(a)/floor <= 1", "(d)/(a) goal", "exposed (g)",
             "goal (g)"))
    for r in rows:
        af = r["a_floor"]
        da = r["d_a"]
        e, eg = r["g"], r["g_goal"]
        print("%4d %10s %10s  %-16s %-22s %-12s %s"
              % (r["np"], num(r["a"] and ms(r["a"]), "%.2f"),
                 num(r["floor"] and ms(r["floor"]), "%.2f"),
                 "%.2f %s" % (af, verdict(af <= 1.0)) if af is not None else "n/a",
                 "%.2f >= %g %s" % (da, r["d_goal"], verdict(da >= r["d_goal"]))
                 if da is not None else "n/a (%s)" % r.get("d_why", ">= %g" % r["d_goal"]),
                 num(e, "%.1f %%"),
                 "<= %.1f %% %s" % (eg, verdict(e <= eg)) if e is not None else "n/a"))
    for r in rows:
        if r["a_floor"] is not None and r["a_floor"] < FLOOR_WARN:
            print("np %d: %s" % (r["np"], floor_warning("(a)/floor", r["a_floor"])))
    by = {r["np"]: r["a_floor"] for r in rows}
    if by.get(2) is not None and by.get(8) is not None:
        print("(a)/floor at np 8 vs np 2 = %.2f vs %.2f   goal: no worse at np 8   %s"
              % (by[8], by[2], verdict(by[8] <= by[2])))


def floor_best(runs):
    """The floor: the best (M) of all the rounds (floor_s, or min_s from an
    older bench_floor), and the copy loop that gave it."""
    best, loop = None, "memcpy"
    for R in runs:
        M = R.get("M")
        if not M:
            continue
        try:
            t = float(M.get("floor_s", M.get("min_s")))
        except (TypeError, ValueError):
            continue
        if best is None or t < best:
            best, loop = t, M.get("loop", "memcpy")
    return best, loop


if sys.argv[1] == "table":
    np_, cores, params, rounds, out, path, why_f, why_d = sys.argv[2:10]
    table(int(np_), int(cores), params, int(rounds), out, path, why_f, why_d)
else:
    cores, params, rounds, path = sys.argv[2:6]
    summary(int(cores), params, int(rounds), path)
PY

py_env=(-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$MASTER_PORT" -x GLOO_SOCKET_IFNAME=lo)
for np in "${nps[@]}"; do
  dir="$out/np$np"
  mkdir -p "$dir"
  mpirun_cmd=(mpirun --oversubscribe --bind-to none --mca btl "self,vader" -np "$np" "${extra[@]}")
  echo "# == np $np: $np processes on $cores cores$( ((np > cores)) && echo ' (oversubscribed)')"
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# np $np, round $r of $ROUNDS: load $(cut -d' ' -f1-3 /proc/loadavg)"
    run bench_sync_mpi "$dir/c.$r.txt" "${mpirun_cmd[@]}" "$exe" "$params" --iters "$ITERS" \
      --warmup "$WARMUP" --modes "$MODES"
    run bench_floor "$dir/m.$r.txt" "$floor" "$params" --threads "$np" --iters "$ITERS" \
      --warmup "$WARMUP"
    if [[ ${SKIP_RAW:-0} != 1 && -x $raw ]]; then
      run bench_raw_mpi "$dir/r.$r.txt" "${mpirun_cmd[@]}" "$raw" "$params" "$ITERS" "$WARMUP"
    fi
    if [[ ${SKIP_GLOO:-0} != 1 ]]; then
      run gloo_flat.py "$dir/f.$r.txt" timeout "${DDP_TIMEOUT:-1800}" "${mpirun_cmd[@]}" \
        "${py_env[@]}" "$PYTHON" "$here/gloo_flat.py" "$params" --iters "$ITERS" --warmup "$WARMUP"
    fi
    if [[ ${SKIP_DDP:-0} != 1 ]]; then
      run ddp_bench.py "$dir/d.$r.txt" timeout "${DDP_TIMEOUT:-1800}" "${mpirun_cmd[@]}" \
        "${py_env[@]}" "$PYTHON" "$here/ddp_bench.py" "$params" --iters "$ITERS" --warmup "$WARMUP"
    fi
  done
  echo "# np $np done: load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$PYTHON" -c "$tables" table "$np" "$cores" "$params" "$ROUNDS" "$dir" "$out/summary.jsonl" \
    "$why_f" "$why_d" || exit 1
  if [[ ${SKIP_GATHER:-0} != 1 && -x $gather ]]; then
    echo
    run bench_sync_gather "$dir/g.txt" "${mpirun_cmd[@]}" "$gather" "$params" \
      --repeat "$ROUNDS" --iters "$ITERS" --warmup "$WARMUP" \
      --methods "${GATHER_METHODS:-shm,backend,mpi,floor}"
    awk -v np="$np" '$1 == "RESULT" && $2 == "G" && $3 == "method=shm" {
        for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        r = v["ratio_floor"] + 0
        goal = np == 2 ? sprintf("goal <= 1.30 at np 2   %s", r <= 1.3 ? "PASS" : "MISS") : \
          "(the goal is at np 2)"
        printf "gather (G): shm /floor = %.2f   %s;   vs best MPI %.2fx\n", r, goal, v["vs_mpi"]
      }' "$dir/g.txt"
  fi
done
"$PYTHON" -c "$tables" summary "$cores" "$params" "$ROUNDS" "$out/summary.jsonl" || exit 1
