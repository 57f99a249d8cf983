#!/usr/bin/env bash
# A small cluster on one Linux machine, for the `cluster` test suite and for
# trying a multi-node layout by hand (docs/launchers.md, "A cluster on one
# machine").  Needs root (or CAP_SYS_ADMIN and CAP_NET_ADMIN): each host is
# a set of namespaces of its own,
#   - uts:  its own hostname (host1, host2, ... unless --hostnames);
#   - pid:  its own process numbers and /proc (so no process of another host
#           can open /proc/<pid>/fd of this one's, as on real hosts);
#   - mount and ipc: its own /dev/shm, a tmpfs of --shm MB, and an
#           /etc/hosts that names every host of the cluster;
#   - net:  its own loopback and eth0, a veth whose other end is on a bridge
#           in a "switch" namespace the cluster also makes; addresses
#           10.77.0.1, 10.77.0.2, ... (/24), reachable only between the
#           cluster's own namespaces.
# Everything hangs off one process per host (its pid namespace's init) and
# one for the switch: killing them removes the hosts, their processes, their
# /dev/shm and their links at once, whatever state they are in.
#
#   cluster.sh up DIR N [--shm MB[,MB...]] [--hostnames a,b,...]
#       make N hosts (1..8) described by the directory DIR (made; it must
#       not hold another cluster).  --shm: each host's /dev/shm size in MiB
#       (one value for all, or one per host; default 256).
#   cluster.sh exec DIR HOST CMD...      run CMD inside HOST (host1, ...)
#   cluster.sh addr DIR HOST             print HOST's address
#   cluster.sh agent DIR HOST CMD...     Open MPI's plm_rsh_agent: like ssh,
#       CMD is one shell command line, run by /bin/sh inside HOST (DIR/agent
#       is a script that calls this with DIR filled in: pass it to mpirun as
#       --mca plm_rsh_agent DIR/agent)
#   cluster.sh mpirun DIR [mpirun args...]   mpirun on the cluster's head
#       node (the switch's network, address 10.77.0.254, but this machine's
#       processes and files, as a login node), with the agent and Open MPI's
#       TCP limited to the cluster's subnet; add --host host1:2,host2:2 and
#       the rest yourself: the ranks run on the hosts only
#   cluster.sh launch DIR PER PORT CMD...   the torchrun-style launch: on
#       every host at once, a launcher (cluster_launch.sh) that starts PER
#       ranks there (PER: one count for every host, or a,b,... per host)
#       with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
#       (host1's address) and MASTER_PORT=PORT, each rank's output in
#       DIR/out/rank-R.log; waits for every launcher and exits with the
#       highest exit status.  The launcher of host H records its pid (in
#       the host's pid namespace) in DIR/HOST.launcher.
#   cluster.sh kill-host DIR HOST        SIGKILL everything in HOST: its
#       processes, network, /dev/shm (the host is lost)
#   cluster.sh link DIR HOST up|down     take HOST's link up or down
#   cluster.sh shm DIR HOST              list HOST's /dev/shm (one name a line)
#   cluster.sh down DIR                  remove the cluster (idempotent)
#   cluster.sh sweep                     remove the clusters whose maker is
#       gone (a test killed before its teardown); `up` sweeps first
# The registry of live clusters is /run/meshpg-cluster/ (one file each,
# naming its directory and the pid of the process that made it).
set -euo pipefail

REG=/run/meshpg-cluster
SUBNET=10.77.0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"

die() { echo "cluster.sh: $*" >&2; exit 2; }

# The init of HOST's namespaces (a pid of this, the root, pid namespace).
host_pid() {
  local f="$1/$2.pid"
  [ -s "$f" ] || die "no host '$2' in cluster $1"
  cat "$f"
}

# nsenter into every namespace of HOST.
in_host() {
  local dir=$1 host=$2
  shift 2
  local pid
  pid=$(host_pid "$dir" "$host")
  exec nsenter -t "$pid" -n -m -u -i -p -- "$@"
}

# Kill the pid recorded in FILE if it is still the process it was (its
# command line carries TAG), and wait for it to go.
kill_recorded() {
  local f=$1 tag=$2 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$tag"; then
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 200); do [ -d "/proc/$pid" ] || break; sleep 0.01; done
  fi
  rm -f "$f"
}

do_down() {
  local dir=$1 f tag
  [ -f "$dir/cluster.id" ] || return 0
  tag="meshpg-cluster-$(cat "$dir/cluster.id")"
  for f in "$dir"/*.pid; do
    [ -e "$f" ] || continue
    kill_recorded "$f" "$tag"
  done
  # The holders (unshare) exit with their inits; reap what is left.
  for f in "$dir"/*.holder; do
    [ -e "$f" ] || continue
    kill_recorded "$f" "$tag"
  done
  rm -f "$REG/$(cat "$dir/cluster.id")"
}

do_sweep() {
  mkdir -p "$REG"
  local f owner dir
  for f in "$REG"/*; do
    [ -e "$f" ] || continue
    owner=$(sed -n 1p "$f")
    dir=$(sed -n 2p "$f")
    if [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null; then continue; fi
    echo "cluster.sh: removing the cluster in $dir (its maker, pid $owner, is gone)" >&2
    if [ -d "$dir" ]; then do_down "$dir"; fi
    rm -f "$f"
  done
}

# Start one holder: unshare's child is the init of the new namespaces; it
# runs SETUP (by bash), then waits forever as a bash, which reaps the
# processes orphaned in its pid namespace (a launcher's ranks after it was
# killed), as an init must.  Writes its pid to DIR/NAME.pid.
start_holder() {
  local dir=$1 name=$2 tag=$3 setup=$4 nsflags=$5 pid child
  # shellcheck disable=SC2086
  setsid unshare $nsflags -- /bin/bash -c "$setup
echo ready >\"$dir/$name.ready\"
exec -a $tag-$name /bin/bash -c 'while :; do sleep 3600 & wait \$!; done'" \
    </dev/null >"$dir/$name.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/$name.holder"
  for _ in $(seq 1 500); do
    [ -f "$dir/$name.ready" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      die "host $name did not start: $(cat "$dir/$name.log")"
    fi
    sleep 0.01
  done
  [ -f "$dir/$name.ready" ] || die "host $name did not start within 5 s: $(cat "$dir/$name.log")"
  child=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null | awk '{print $1}')
  # Without a pid namespace, unshare execs the shell itself.
  [ -n "$child" ] || child=$pid
  echo "$child" >"$dir/$name.pid"
}

do_up() {
  local dir=$1 n=$2
  shift 2
  local shm=256 names=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --shm) shm=$2; shift 2 ;;
      --hostnames) names=$2; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  case "$n" in [1-8]) ;; *) die "up: N must be 1..8, not '$n'" ;; esac
  [ "$(id -u)" = 0 ] || die "up: needs root (namespaces, veth links)"
  do_sweep
  mkdir -p "$dir" "$dir/out"
  [ ! -f "$dir/cluster.id" ] || die "up: $dir already holds a cluster"
  local id
  id=$(printf '%s%04x' "$(date +%s | tail -c 5)" $((RANDOM & 0xffff)))
  id=${id: -6}
  echo "$id" >"$dir/cluster.id"
  # Whatever fails (or kills us) from here on, what was made goes.
  trap 'do_down "$dir"' EXIT
  trap 'exit 130' INT TERM HUP
  # The cluster outlives this command (up, then exec ..., then down): it
  # belongs to the caller, MESHPG_CLUSTER_OWNER (a pid) or our parent.
  printf '%s\n%s\n' "${MESHPG_CLUSTER_OWNER:-$PPID}" "$dir" >"$REG/$id"
  local tag="meshpg-cluster-$id"
  IFS=, read -r -a shms <<<"$shm"
  IFS=, read -r -a hostnames <<<"$names"
  {
    echo "127.0.0.1 localhost"
    for i in $(seq 1 "$n"); do echo "$SUBNET.$i host$i ${hostnames[$((i - 1))]:-}"; done
  } >"$dir/hosts"
  start_holder "$dir" switch "$tag" "ip link set lo up; ip link add br0 type bridge; ip addr add $SUBNET.254/24 dev br0; ip link set br0 up" \
    "--net --fork --pid --mount-proc --mount"
  local spid
  spid=$(host_pid "$dir" switch)
  for i in $(seq 1 "$n"); do
    local h="host$i" mb=${shms[$((i - 1))]:-${shms[0]}} hn=${hostnames[$((i - 1))]:-host$i}
    case "$mb" in ''|*[!0-9]*) die "up: --shm takes MiB, not '$mb'" ;; esac
    start_holder "$dir" "$h" "$tag" \
      "hostname $hn; mount -t tmpfs -o size=${mb}m,mode=1777 tmpfs /dev/shm; mount --bind $dir/hosts /etc/hosts; ip link set lo up" \
      "--net --mount --uts --ipc --pid --fork --mount-proc"
    local hpid a="mc${id}h$i" b="mc${id}s$i"
    hpid=$(host_pid "$dir" "$h")
    ip link add "$a" type veth peer name "$b"
    ip link set "$a" netns "$hpid"
    ip link set "$b" netns "$spid"
    nsenter -t "$spid" -n -- ip link set "$b" master br0
    nsenter -t "$spid" -n -- ip link set "$b" up
    nsenter -t "$hpid" -n -- ip link set "$a" name eth0
    nsenter -t "$hpid" -n -- ip addr add "$SUBNET.$i/24" dev eth0
    nsenter -t "$hpid" -n -- ip link set eth0 up
  done
  echo "$n" >"$dir/cluster.hosts"
  # Open MPI's rsh agent, with this cluster's directory filled in.
  printf '#!/bin/sh\nexec %s agent %s "$@"\n' "$self" "$dir" >"$dir/agent"
  chmod +x "$dir/agent"
  # Wait until host1 reaches every host (the links come up).
  for i in $(seq 2 "$n"); do
    local ok=0
    for _ in $(seq 1 100); do
      # A refused connection (nothing listens on port 9) proves the path.
      local said
      said=$(nsenter -t "$(host_pid "$dir" host1)" -n -- timeout 2 bash -c \
               "exec 3<>/dev/tcp/$SUBNET.$i/9" 2>&1 || true)
      case "$said" in *refused*) ok=1; break ;; esac
      sleep 0.05
    done
    [ "$ok" = 1 ] || die "up: host1 cannot reach host$i"
  done
  trap - EXIT INT TERM HUP
}

# Open MPI calls its rsh agent as: AGENT [-x] HOST CMD...; like ssh, the
# command words are joined into one shell command line.
do_agent() {
  local dir=$1
  shift
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
  local host=$1
  shift
  in_host "$dir" "$host" /bin/sh -c "$*"
}

do_launch() {
  local dir=$1 per=$2 port=$3
  shift 3
  local n
  n=$(cat "$dir/cluster.hosts")
  IFS=, read -r -a pers <<<"$per"
  local world=0 starts=()
  for i in $(seq 1 "$n"); do
    starts+=("$world")
    world=$((world + ${pers[$((i - 1))]:-${pers[0]}}))
  done
  local pids=() rc=0
  for i in $(seq 1 "$n"); do
    local k=${pers[$((i - 1))]:-${pers[0]}}
    [ "$k" -gt 0 ] || continue
    "$self" exec "$dir" "host$i" /bin/bash "$here/cluster_launch.sh" "$dir" "host$i" \
      "${starts[$((i - 1))]}" "$k" "$world" "$SUBNET.1" "$port" "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    local r=0
    wait "$p" || r=$?
    [ "$r" -gt "$rc" ] && rc=$r
  done
  return "$rc"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) [ $# -ge 2 ] || die "usage: up DIR N [--shm MB[,MB...]] [--hostnames a,b,...]"; do_up "$@" ;;
  down) [ $# -eq 1 ] || die "usage: down DIR"; do_down "$1"; mkdir -p "$REG" ;;
  sweep) do_sweep ;;
  exec) [ $# -ge 3 ] || die "usage: exec DIR HOST CMD..."; d=$1 h=$2; shift 2; in_host "$d" "$h" "$@" ;;
  addr) [ $# -eq 2 ] || die "usage: addr DIR HOST"; host_pid "$1" "$2" >/dev/null; echo "$SUBNET.${2#host}" ;;
  agent) [ $# -ge 3 ] || die "usage: agent DIR HOST CMD..."; do_agent "$@" ;;
  mpirun)
    [ $# -ge 1 ] || die "usage: mpirun DIR [mpirun args...]"
    d=$1; shift
    # On the head node: the switch's network (10.77.0.254), this
    # machine's processes and files, so that the agent sees every host.
    exec nsenter -t "$(host_pid "$d" switch)" -n -- mpirun --mca plm_rsh_agent "$d/agent" \
      --mca btl_tcp_if_include "$SUBNET.0/24" --mca oob_tcp_if_include "$SUBNET.0/24" "$@" ;;
  launch) [ $# -ge 4 ] || die "usage: launch DIR PER PORT CMD..."; do_launch "$@" ;;
  kill-host)
    [ $# -eq 2 ] || die "usage: kill-host DIR HOST"
    kill -KILL "$(host_pid "$1" "$2")" ;;
  link)
    [ $# -eq 3 ] || die "usage: link DIR HOST up|down"
    case "$3" in up|down) ;; *) die "link: up or down, not '$3'" ;; esac
    nsenter -t "$(host_pid "$1" "$2")" -n -- ip link set eth0 "$3" ;;
  shm) [ $# -eq 2 ] || die "usage: shm DIR HOST"; in_host "$1" "$2" ls -A /dev/shm ;;
  *) die "usage: cluster.sh up|down|sweep|exec|addr|agent|mpirun|launch|kill-host|link|shm ..." ;;
esac
