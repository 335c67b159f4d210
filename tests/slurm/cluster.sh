#!/bin/bash
# A one-node Slurm cluster on this machine, for the tests in tests/slurm: Debian's slurm-wlm and munge,
# started as root, with state, spool and logs under one directory.
#
#   tests/slurm/cluster.sh install        # apt-get the packages (once per machine)
#   tests/slurm/cluster.sh start DIR      # write DIR/slurm.conf, start munged, slurmctld, slurmd
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
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmi2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
    munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    slurmctld -f "$dir/slurm.conf"
    slurmd -f "$dir/slurm.conf"
    export SLURM_CONF=$dir/slurm.conf
    for _ in $(seq 100); do  # until the node reports in (a second or two)
        if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            return
        fi
        sleep 0.2
    done
    echo "the Slurm node did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    exit 1
}

stop() {
    local dir=$1 f
    for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
        if [ -f "$f" ]; then
            kill "$(cat "$f")" 2>/dev/null || true
        fi
    done
}

"$@"
