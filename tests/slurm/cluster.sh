#!/bin/bash
# A two-node Slurm cluster on this machine, for the tests in tests/slurm: Debian's slurm-wlm and munge,
# started as root, with state, spool and logs under one directory. The controller runs here; each node's
# slurmd runs as host mnodeK at 127.0.0.(K+1), in a UTS and mount namespace of its own (its own host
# name and /dev/shm, as tests/hosts/ssh-ns makes hosts for mpiexec), so that jobs span two real hosts
# whose ranks talk over TCP. Every address is in 127.0.0.0/8.
#
#   tests/slurm/cluster.sh install        # apt-get the packages (once per machine)
#   tests/slurm/cluster.sh start DIR      # write DIR/slurm.conf, start munged, slurmctld, two slurmd
#   tests/slurm/cluster.sh stop DIR       # stop them (by the PIDs they recorded)
#
# Clients need SLURM_CONF=DIR/slurm.conf. MpiDefault=pmi2 is what the mpich wheel speaks.
set -euo pipefail

install() {
    if command -v slurmctld >/dev/null && command -v munged >/dev/null; then
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "installing Slurm needs root (apt-get install slurm-wlm munge)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

start() {
    local dir=$1 host
    host=$(hostname -s)
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=ddpipe
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmi2
# heterogeneous jobs (examples/slurm_decode_service.sh) are scheduled by backfill only: builtin refuses them
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# a step whose node froze is given up after 5 s rather than the default 30: the frozen-node test's
# bound (a minute) then stays far from its normal time
KillWait=5
NodeName=mnode1 NodeAddr=127.0.0.2 Port=6818 CPUs=$(nproc) State=UNKNOWN
NodeName=mnode2 NodeAddr=127.0.0.3 Port=6819 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=mnode[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
    mkdir -p "$dir/spool/mnode1" "$dir/spool/mnode2"
    "$(dirname "$0")/../hosts/names.sh" add >/dev/null
    munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    slurmctld -f "$dir/slurm.conf"
    local node
    for node in mnode1 mnode2; do  # slurmd forks into the background, inside the namespace it was started in
        unshare --uts --mount --fork bash -c \
            'hostname "$0" && mount -t tmpfs -o size=4g tmpfs /dev/shm && exec slurmd -N "$0" -f "$1"' \
            "$node" "$dir/slurm.conf"
    done
    export SLURM_CONF=$dir/slurm.conf
    for _ in $(seq 150); do  # until both nodes report in (a few seconds)
        if [ "$(sinfo -h -N -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" = 2 ]; then
            return
        fi
        sleep 0.2
    done
    echo "the Slurm nodes did not come up; see $dir/slurmctld.log and $dir/slurmd-mnode*.log" >&2
    exit 1
}

stop() {
    local dir=$1 f pid pids=()
    # jobs first: a job still running (its test timed out) outlived the daemons, its tasks orphaned and
    # spinning through the next test run; cancelled, its tasks end within KillWait
    if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
        SLURM_CONF=$dir/slurm.conf scancel --user=root 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(SLURM_CONF=$dir/slurm.conf squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        if [ -f "$f" ] && pid=$(cat "$f") && kill "$pid" 2>/dev/null; then
            pids+=("$pid")
        fi
    done
    # until they are gone (a controller still shutting down holds its port, and a cluster started
    # next would talk to it); then SIGKILL what is left
    for _ in $(seq 50); do
        local alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ "$alive" = 0 ] && break
        sleep 0.2
    done
    for pid in "${pids[@]}"; do
        kill -9 "$pid" 2>/dev/null || true
    done
    "$(dirname "$0")/../hosts/names.sh" remove
}

"$@"
