#!/usr/bin/env bash
# The torchrun-style launcher of one host of a cluster.sh cluster, run
# inside the host by `cluster.sh launch`: it starts this host's K ranks,
# START .. START+K-1, with the variables torchrun (and Slurm, by other
# names) gives each worker, and no mpirun:
#   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
# Each rank's stdout and stderr go to DIR/out/rank-R.log.  It waits for all
# of them and exits with the highest exit status (128+N for a signal N), as
# torchrun's agent reports a failed worker; SIGTERM is passed on to the ranks.
# Like torchrun with --rdzv-id, it exports TORCHELASTIC_RUN_ID, one per
# launch (the cluster and the port) unless the caller set it: the job id
# from which the ranks derive the rendezvous' job key (docs/launchers.md,
# "The rendezvous and its job key"); a MESHPG_JOB_KEY in the environment
# passes through and wins.
#   cluster_launch.sh DIR HOST START K WORLD MASTER_ADDR MASTER_PORT CMD...
set -uo pipefail
dir=$1 host=$2 start=$3 k=$4 world=$5 maddr=$6 mport=$7
shift 7
export TORCHELASTIC_RUN_ID=${TORCHELASTIC_RUN_ID:-meshpg-cluster-$(basename "$dir")-$mport}
echo $$ >"$dir/$host.launcher"
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
for ((l = 0; l < k; l++)); do
  r=$((start + l))
  RANK=$r WORLD_SIZE=$world LOCAL_RANK=$l LOCAL_WORLD_SIZE=$k \
    MASTER_ADDR=$maddr MASTER_PORT=$mport "$@" >"$dir/out/rank-$r.log" 2>&1 &
  pids+=($!)
  echo "$!" >"$dir/$host.rank-$r.pid"
done
rc=0
for p in "${pids[@]}"; do
  r=0
  wait "$p" || r=$?
  [ "$r" -gt "$rc" ] && rc=$r
done
exit "$rc"
