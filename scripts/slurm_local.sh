#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for the tests that submit through sbatch (tests/launchers/test_slurm*.py):
#
#   bash scripts/slurm_local.sh start    # install what is missing, configure, start, wait for idle nodes
#   bash scripts/slurm_local.sh status   # the daemons and `sinfo`; exit 0 when the cluster takes jobs
#   bash scripts/slurm_local.sh stop     # stop exactly the daemons `start` started (their pid files)
#
# Debian 12's slurm-wlm 22.05 (+ munge, slurmdbd, mariadb-server: apt-get, ~25 s, needs root). Three nodes on
# one host (`slurmd -N mfc-node1|2|3`, each its own Port, names resolved through an /etc/hosts line): partition
# `debug` (the default) has the first two, `three` all three (a run that loses a node goes on with two),
# 8 fake GPUs each (character devices: Slurm refuses a GRES without File= and regular files), accounting
# through slurmdbd (its own port) on a local mariadb, so `sacct` answers as on a real cluster.
# AuthInfo=cred_expire=30 and sched_interval=10 make a requeued job start again within ~30 s (default 121 s).
# State, logs and pid files live in MFC_SLURM_DIR (default /var/tmp/mfc-slurm), outside the checkout; the
# config is /etc/slurm/slurm.conf (written only when absent or written by this script). Starting twice is
# harmless (a file lock, which no daemon inherits; what runs is kept). Nothing here is needed to train: only for the Slurm tests.
set -euo pipefail
STATE=${MFC_SLURM_DIR:-/var/tmp/mfc-slurm}
CONF_DIR=/etc/slurm
MARK="# written by megatron-fixedcode scripts/slurm_local.sh"
NODES=(mfc-node1 mfc-node2 mfc-node3)
PORTS=(6818 6838 6848)
DBD_PORT=6819
CPUS=${MFC_SLURM_CPUS:-8}
log() { echo "slurm_local: $*" >&2; }
die() { echo "slurm_local: error: $*" >&2; exit 1; }

alive() {  # $1: pid file: the pid it names runs
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    local missing=() cmd
    for cmd in slurmctld slurmd slurmdbd munged mariadbd sbatch; do
        command -v "$cmd" >/dev/null || PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    ((${#missing[@]})) || return 0
    ((EUID == 0)) || die "missing ${missing[*]}: run as root (apt-get install slurm-wlm munge slurmdbd mariadb-server)"
    log "installing slurm-wlm munge slurmdbd mariadb-server (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$STATE/log/apt.log" 2>&1 || { tail -5 "$STATE/log/apt.log" >&2; die "apt-get update failed"; }
    apt-get install -y -qq slurm-wlm munge slurmdbd mariadb-server >>"$STATE/log/apt.log" 2>&1 \
        || { tail -5 "$STATE/log/apt.log" >&2; die "apt-get install failed (log: $STATE/log/apt.log)"; }
}

write_config() {
    local host n i before
    host=$(hostname)
    before=$(cat "$CONF_DIR/slurm.conf" "$CONF_DIR/gres.conf" 2>/dev/null | md5sum)
    if [[ -f $CONF_DIR/slurm.conf ]] && ! grep -qF "$MARK" "$CONF_DIR/slurm.conf"; then
        die "$CONF_DIR/slurm.conf exists and was not written by this script: not touching a real cluster's config"
    fi
    mkdir -p "$CONF_DIR" "$STATE"/{ctld,log,dev} "${NODES[@]/#/$STATE/spool/}"
    for i in 0 1 2 3 4 5 6 7; do
        [[ -c $STATE/dev/nvidia$i ]] || { rm -f "$STATE/dev/nvidia$i"; mknod "$STATE/dev/nvidia$i" c 195 "$i"; }
    done
    {
        echo "$MARK"
        cat <<EOF
ClusterName=mfc
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
AuthType=auth/munge
AuthInfo=cred_expire=30
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=10
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=256
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=30
MinJobAge=600
InactiveLimit=0
EOF
        for i in "${!NODES[@]}"; do
            echo "NodeName=${NODES[$i]} NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[$i]} CPUs=$CPUS RealMemory=$((CPUS * 512)) Gres=gpu:8 State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=mfc-node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
        echo "PartitionName=three Nodes=ALL MaxTime=INFINITE State=UP OverSubscribe=YES"
    } >"$CONF_DIR/slurm.conf"
    { echo "$MARK"; echo "NodeName=mfc-node[1-3] Name=gpu File=$STATE/dev/nvidia[0-7]"; } >"$CONF_DIR/gres.conf"
    # slurmdbd refuses a config readable by others
    (umask 077; cat >"$CONF_DIR/slurmdbd.conf" <<EOF
$MARK
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
AuthType=auth/munge
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=mfc-slurm
StorageLoc=slurm_acct_db
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
EOF
    )
    # a controller started with another node list keeps it: the daemons restart to read this one
    [[ $(cat "$CONF_DIR/slurm.conf" "$CONF_DIR/gres.conf" | md5sum) == "$before" ]] || CONFIG_CHANGED=1
    # the second node's name must resolve (the launcher's rendezvous address is the first node's name)
    for n in "${NODES[@]}"; do
        getent hosts "$n" >/dev/null || echo "127.0.0.1 $n   $MARK" >>/etc/hosts
    done
}

wait_for() {  # $1: seconds, $2...: command that must succeed
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

nodes_ready() {  # every node idle, mixed or allocated (not down, drained or unknown)
    local states
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
    [[ $(grep -cE '^mfc-node[1-3] (idle|mixed|allocated|completing)' <<<"$states") == "${#NODES[@]}" ]]
}

start_daemons() {
    # munge: the package made the key; run it as its user
    if ! pgrep -x munged >/dev/null; then
        mkdir -p /run/munge && chown munge:munge /run/munge && rm -f /run/munge/munged.pid
        runuser -u munge -- /usr/sbin/munged 9>&-
        wait_for 10 test -s /run/munge/munged.pid || die "munged did not start"
        cp /run/munge/munged.pid "$STATE/munged.pid"
    fi
    if ! mysqladmin ping >/dev/null 2>&1; then
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld && rm -f /run/mysqld/mfc-mariadbd.pid
        setsid /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mfc-mariadbd.pid --skip-networking=0 \
            --bind-address=127.0.0.1 >>"$STATE/log/mariadbd.log" 2>&1 </dev/null 9>&- &
        wait_for 60 mysqladmin ping || die "mariadbd did not start (log: $STATE/log/mariadbd.log)"
        cp /run/mysqld/mfc-mariadbd.pid "$STATE/mariadbd.pid"   # its own pid file: mysql may not write $STATE
    fi
    mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'mfc-slurm';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
    if ! alive "$STATE/slurmdbd.pid"; then
        /usr/sbin/slurmdbd 9>&-
        wait_for 30 sacctmgr -i show cluster || die "slurmdbd did not answer (log: $STATE/log/slurmdbd.log)"
    fi
    sacctmgr -i show cluster -n format=cluster | grep -qw mfc || sacctmgr -i add cluster mfc >/dev/null
    if ! alive "$STATE/slurmctld.pid"; then
        /usr/sbin/slurmctld 9>&-
        wait_for 30 scontrol ping || die "slurmctld did not start (log: $STATE/log/slurmctld.log)"
    fi
    local n
    for n in "${NODES[@]}"; do
        alive "$STATE/slurmd-$n.pid" || /usr/sbin/slurmd -N "$n" 9>&-
    done
    if ! wait_for 60 nodes_ready; then
        scontrol update nodename=mfc-node[1-3] state=resume >/dev/null 2>&1 || true
        wait_for 30 nodes_ready || die "nodes not idle: $(sinfo -h -N -o '%N %T %E' | tr '\n' ' ') (logs: $STATE/log)"
    fi
}

stop_daemons() {
    local f pid pids=()
    # slurmd first, the controller, accounting, then what they need
    for f in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid" "$STATE/slurmdbd.pid" "$STATE/mariadbd.pid" "$STATE/munged.pid"; do
        [[ -s $f ]] || continue
        pid=$(cat "$f")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            pids+=("$pid")
            for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        fi
        rm -f "$f"
    done
    log "stopped ${#pids[@]} daemons${pids:+ (pids ${pids[*]})}"
}

status() {
    local f name ok=0
    for f in "$STATE"/munged.pid "$STATE"/mariadbd.pid "$STATE"/slurmdbd.pid "$STATE"/slurmctld.pid "$STATE"/slurmd-*.pid; do
        name=$(basename "$f" .pid)
        if alive "$f"; then echo "$name: running (pid $(cat "$f"))"; else echo "$name: not running"; fi
    done
    command -v sinfo >/dev/null && sinfo -N -o '%N %T %G %c %m' 2>/dev/null || true
    nodes_ready || ok=1
    return $ok
}

cmd=${1:-}
case $cmd in
    start|stop|status) ;;
    *) echo "usage: bash scripts/slurm_local.sh start|stop|status" >&2; exit 2 ;;
esac
mkdir -p "$STATE/log"
export PATH=$PATH:/usr/sbin:/sbin
exec 9>"$STATE/lock"
flock 9
case $cmd in
    start)
        ((EUID == 0)) || die "needs root (daemons, /etc/slurm, /etc/hosts)"
        if command -v sinfo >/dev/null && nodes_ready; then log "already running"; exit 0; fi
        install_packages
        CONFIG_CHANGED=0
        write_config
        if ((CONFIG_CHANGED)) && alive "$STATE/slurmctld.pid"; then
            log "the node list changed: restarting slurmctld and the slurmd's"
            for f in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
                alive "$f" || continue
                pid=$(cat "$f")
                kill -TERM "$pid" && { wait_for 20 bash -c "! kill -0 $pid" || kill -KILL "$pid"; } || true
                rm -f "$f"
            done
        fi
        start_daemons
        log "ready: $(sinfo -h -N -o '%N %T' | sort -u | tr '\n' ' ')(state, logs: $STATE)" ;;
    stop) stop_daemons ;;
    status) status ;;
esac
