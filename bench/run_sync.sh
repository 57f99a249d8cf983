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
# One run does, in order, with the same mpirun line
#   mpirun --oversubscribe --bind-to none --mca btl self,vader -np $NP
#   1. bench_sync_mpi PARAMS: (a) meshpg sync, (b) flat all-reduce, (c) the
#      naive per-tensor recipe, (r)/(i) raw MPI references, interleaved;
#      then the overlap with busy CPU compute (o), the same polling MPI
#      (p), with device-like compute where the host thread sleeps (g), and
#      no-overlap (n) simulated backward with
#      T_comm = median of (a) from this same run;
#   2. bench/ddp_bench.py PARAMS under /usr/bin/python3 (Debian
#      python3-torch, gloo): (d) DDP sync time;
# and prints every RESULT line and one table: medians, GB/s (= parameter
# bytes / median time), the ratios (a)/(b) bandwidth and (d)/(a) time, and
# the exposed communication with and without overlap, against the goals.
#
# Environment: NP (4), ITERS (20), WARMUP (3), MODES (a,b,c,r,i,o,p,g,n; add
# s,1 for more profile rows), MASTER_PORT (29500 + pid % 1000), PYTHON
# (/usr/bin/python3), SKIP_DDP=1 to leave out (d), DDP_TIMEOUT (1800 s,
# a guard against a hung torch teardown), MPIRUN_EXTRA (more
# mpirun arguments, e.g. "-x MALLOC_MMAP_THRESHOLD_=4294967295").
# Exit status: 0 when both programs ran (a missed goal is reported as MISS,
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
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-3}
MODES=${MODES:-a,b,c,r,i,o,p,g,n}
PYTHON=${PYTHON:-/usr/bin/python3}
MASTER_PORT=${MASTER_PORT:-$((29500 + $$ % 1000))}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2206
extra=(${MPIRUN_EXTRA:-})
mpirun_cmd=(mpirun --oversubscribe --bind-to none --mca btl "self,vader" -np "$NP" "${extra[@]}")

out=$(mktemp -d "${TMPDIR:-/tmp}/run_sync.XXXXXX")
trap 'rm -rf "$out"' EXIT

cores=$(nproc)
echo "# run_sync.sh: $(date -u +%FT%TZ) on $(hostname): $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(mpirun --version 2>/dev/null | head -1); $NP processes on $cores cores$([[ $NP -gt $cores ]] && echo ' (oversubscribed)')"
echo "# params: $params; $ITERS timed iterations after $WARMUP warm-up"
echo "# + ${mpirun_cmd[*]} $exe $params --iters $ITERS --warmup $WARMUP --modes $MODES"
if ! "${mpirun_cmd[@]}" "$exe" "$params" --iters "$ITERS" --warmup "$WARMUP" \
    --modes "$MODES" >"$out/c.txt" 2>"$out/c.err"; then
  cat "$out/c.txt" "$out/c.err" >&2
  echo "run_sync.sh: bench_sync_mpi failed" >&2
  exit 1
fi
cat "$out/c.txt"

if [[ ${SKIP_DDP:-0} != 1 ]]; then
  echo "# + ${mpirun_cmd[*]} -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$MASTER_PORT -x GLOO_SOCKET_IFNAME=lo $PYTHON $here/ddp_bench.py $params --iters $ITERS --warmup $WARMUP"
  if ! timeout "${DDP_TIMEOUT:-1800}" "${mpirun_cmd[@]}" -x MASTER_ADDR=127.0.0.1 \
      -x MASTER_PORT="$MASTER_PORT" \
      -x GLOO_SOCKET_IFNAME=lo "$PYTHON" "$here/ddp_bench.py" "$params" \
      --iters "$ITERS" --warmup "$WARMUP" >"$out/d.txt" 2>"$out/d.err"; then
    cat "$out/d.txt" "$out/d.err" >&2
    echo "run_sync.sh: ddp_bench.py failed" >&2
    exit 1
  fi
  cat "$out/d.txt"
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# The table (python3 of the system: only the standard library).
touch "$out/d.txt"
"$PYTHON" - "$NP" "$cores" "$params" "$out/c.txt" "$out/d.txt" <<'PY'
import sys
np_, cores, params = sys.argv[1:4]
R = {}
for path in sys.argv[4:]:
    for line in open(path):
        if line.startswith("RESULT "):
            f = line.split()
            R[f[1]] = dict(x.split("=", 1) for x in f[2:])


def g(m, k="median_s"):
    return float(R[m][k]) if m in R and k in R[m] else None


def ms(x):
    return x * 1e3


rows = [
    ("a", "meshpg mpg_sync: begin + mark_ready x N (backward order) + finish"),
    ("b", "flat mpg_all_reduce avg, one contiguous buffer (ceiling)"),
    ("c", "naive: per-tensor mpg_all_reduce sum + divide loop"),
    ("d", "PyTorch DDP gloo, bucket_cap_mb=25: backward - no_sync backward"),
    ("r", "ref: raw MPI_Allreduce(IN_PLACE, sum) + divide loop"),
    ("i", "ref: raw MPI_Iallreduce + MPI_Wait + divide loop"),
    ("s", "profile: mpg_sync with op sum (no divide pass)"),
    ("1", "profile: mpg_sync with one bucket"),
]
by = next((float(R[m]["bytes"]) for m in R if "bytes" in R[m]), 0.0)
print()
print("== issue-4 sync benchmark: %s, %.2f MB f32, Open MPI, np=%s on %s cores =="
      % (params, by / 1e6, np_, cores))
print("%-4s%-66s%10s%9s%8s  %s" % ("", "mode", "median ms", "min ms", "GB/s", "extra"))
for m, desc in rows:
    if m not in R:
        continue
    t, mn = g(m), g(m, "min_s")
    ex = []
    if "buckets" in R[m] and R[m]["buckets"] != "?":
        ex.append("buckets=" + R[m]["buckets"])
    if R[m].get("faults", "0") != "0":
        ex.append("page faults/step " + R[m]["faults"])
    if "calls" in R[m]:
        ex.append("calls=" + R[m]["calls"])
    if "allreduce_s" in R[m]:
        ex.append("allreduce %.1f ms + divide %.1f ms"
                  % (ms(g(m, "allreduce_s")), ms(g(m, "divide_s"))))
    if m == "d":
        ex.append("backward %.1f ms - no_sync backward %.1f ms"
                  % (ms(g(m, "ddp_backward_s")), ms(g(m, "nosync_backward_s"))))
    bw = by / t / 1e9 if t and t > 0 else float("nan")
    print("(%s) %-66s%10.2f%9.2f%8.3f  %s" % (m, desc, ms(t), ms(mn), bw, ", ".join(ex)))
for m, desc in (("o", "overlap: compute T_comm spread over backward, marks as it goes"),
                ("p", "profile: o, compute polls MPI progress every 100 us"),
                ("g", "overlap, compute on a device: host thread sleeps"),
                ("n", "no overlap: compute T_comm, then mark all ready, finish")):
    if m not in R:
        continue
    print("(%s) %-66s%10.2f%9.2f%8s  step; T_comm %.1f ms, exposed %.1f ms = %.1f%% "
          "(in mark_ready %.1f ms, in finish %.1f ms)"
          % (m, desc, ms(g(m)), ms(g(m, "min_s")), "", ms(g(m, "t_comm_s")),
             ms(g(m, "exposed_s")), g(m, "exposed_pct"), ms(g(m, "in_mark_ready_s")),
             ms(g(m, "in_finish_s"))))
print()


def verdict(ok):
    return "PASS" if ok else "MISS"


a, b, c, d = g("a"), g("b"), g("c"), g("d")
if a and b:
    r = b / a  # (bytes / a) / (bytes / b)
    print("(a)/(b) bandwidth   = %7.3f    goal >= 0.95   %s" % (r, verdict(r >= 0.95)))
if a and d:
    r = d / a
    print("(d)/(a) time        = %7.3f    goal >= 2      %s" % (r, verdict(r >= 2.0)))
if a and c:
    print("(c)/(a) time        = %7.3f" % (c / a))
if a and g("r"):
    print("(a)/(r) bandwidth   = %7.3f    (against raw blocking MPI_Allreduce)" % (g("r") / a))
for m, what in (("g", "overlap, device compute (g)"),
                ("o", "overlap, busy CPU compute (o)")):
    if m in R:
        e = g(m, "exposed_pct")
        print("exposed, %-29s = %5.1f %%  goal <= 25%%   %s   (floor: the last-ready "
              "tensor holds %.1f %% of the bytes)"
              % (what, e, verdict(e <= 25.0), g(m, "bound_pct")))
if "p" in R:
    print("exposed, overlap, CPU compute polling MPI (p) = %5.1f %%" % g("p", "exposed_pct"))
if "n" in R:
    print("exposed, no overlap = %7.1f %%" % g("n", "exposed_pct"))
PY
