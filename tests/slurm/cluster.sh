#!/bin/sh
# cluster.sh - a throw-away single-node Slurm (munged, slurmctld, slurmd) on
# loopback, with the mmguard SPANK plugin in plugstack.conf.  Needs root (slurmd).
#
#   sh tests/slurm/cluster.sh start|stop|status|restart
#
# Environment:
#   CLUSTER_DIR     where everything lives; state is wiped on every start.
#                   `start` without it makes a new /tmp/mmguard-slurm.XXXXXX
#                   (so that clusters of parallel runs never collide) and
#                   prints it; stop/status/restart need it.  After start,
#                   source $CLUSTER_DIR/env.sh to use sbatch/srun/salloc.
#   PLUGIN          spank_mmguard.so to load (default build/spank_mmguard.so);
#                   PLUGIN=none gives an empty plugstack.conf
#   PLUGIN_ARGS     extra key=value arguments for the plugstack line
#   PLUGIN_REQUIRED required (default) | optional
#   MMGUARD_CONF    mmguard.conf to use: copied to $CLUSTER_DIR/etc/mmguard.conf
#                   (next to slurm.conf, where job_submit.lua finds it) and
#                   passed to the plugin as config=...
#   CTLD_MMGUARD_CONF  exported to slurmctld as MMGUARD_CONF (the override)
#   JOB_SUBMIT_LUA  job_submit.lua: copied next to slurm.conf, JobSubmitPlugins=lua
#   GRES            GPU GRES of the node (default h100:8), e.g. h100:8,h200:4;
#                   each GPU is a symlink to /dev/null (gres.conf File=)
#   NODE_MEM        the node's RealMemory in MB (default: Slurm's 1); slurmd then
#                   reports the configured values (SlurmdParameters=config_overrides)
#   SLURM_EXTRA     extra lines appended to slurm.conf
# Every wait is bounded; daemons are stopped by PID with a SIGKILL fallback.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ -z "${CLUSTER_DIR:-}" ]; then
    case "${1:-}" in
    start) CLUSTER_DIR=$(mktemp -d /tmp/mmguard-slurm.XXXXXX) ;;
    *) echo "cluster: set CLUSTER_DIR to the directory of the cluster" >&2; exit 2 ;;
    esac
fi
dir=$CLUSTER_DIR
plugin=${PLUGIN:-$root/build/spank_mmguard.so}
gres=${GRES:-h100:8}

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

# wait_for SECONDS CMD...: poll CMD every 0.1 s until it succeeds
wait_for() {
    _n=$(($1 * 10)); shift
    while [ "$_n" -gt 0 ]; do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1; _n=$((_n - 1))
    done
    return 1
}

# a TCP port no socket uses, in any state, below the kernel's ephemeral range:
# a port above it can be taken by a client connection (sbatch makes many)
# between this check and slurmctld's bind, which then fails "Address already
# in use".  Falls back to 20000..59999 if the ephemeral range starts low.
free_port() {
    _used=$(awk 'NR > 1 { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)
    _eph=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    if [ "${_eph:-0}" -gt 12000 ]; then _lo=10000; _n=$((_eph - 10000)); else _lo=20000; _n=40000; fi
    while :; do
        _p=$(( ($(od -An -N2 -tu2 /dev/urandom) % _n) + _lo ))
        _h=$(printf '%04X' "$_p")
        case " $(echo $_used) " in *" $_h "*) continue ;; esac
        echo "$_p"; return 0
    done
}

pid_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

stop_pid() { # stop_pid NAME PIDFILE
    [ -f "$2" ] || return 0
    _pid=$(cat "$2" 2>/dev/null || true)
    if pid_alive "$_pid"; then
        kill -TERM "$_pid" 2>/dev/null || true
        if ! wait_for 5 sh -c "! kill -0 $_pid"; then
            log "$1 ($_pid) ignored SIGTERM; SIGKILL"
            kill -KILL "$_pid" 2>/dev/null || true
            wait_for 2 sh -c "! kill -0 $_pid" || log "$1 ($_pid) still alive"
        fi
    fi
    rm -f "$2"
}

# slurmstepd processes of this cluster: those with a file open under $dir
stepd_pids() {
    for _p in /proc/[0-9]*; do
        _comm=$(cat "$_p/comm" 2>/dev/null || true)
        case "$_comm" in slurmstepd*) ;; *) continue ;; esac
        for _fd in "$_p"/fd/*; do
            case $(readlink "$_fd" 2>/dev/null) in "$dir"/*) echo "${_p#/proc/}"; break ;; esac
        done
    done
}

do_stop() {
    if [ -f "$dir/env.sh" ] && [ -f "$dir/run/slurmctld.pid" ]; then
        SLURM_CONF=$dir/etc/slurm.conf timeout 5 scancel --quiet --user="$(id -un)" 2>/dev/null || true
    fi
    stop_pid slurmd "$dir/run/slurmd.pid"
    for _p in $(stepd_pids); do kill -KILL "$_p" 2>/dev/null || true; done
    stop_pid slurmctld "$dir/run/slurmctld.pid"
    stop_pid munged "$dir/run/munged.pid"
}

do_status() {
    _rc=0
    for _d in munged slurmctld slurmd; do
        _pid=$(cat "$dir/run/$_d.pid" 2>/dev/null || true)
        if pid_alive "$_pid"; then echo "$_d running ($_pid)"; else echo "$_d stopped"; _rc=1; fi
    done
    if [ "$_rc" -eq 0 ]; then SLURM_CONF=$dir/etc/slurm.conf sinfo -h -o '%N %t %G' || _rc=1; fi
    return "$_rc"
}

write_configs() {
    ctld_port=$(free_port)
    slurmd_port=$(free_port)
    while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port); done
    node_gres=""
    : >"$dir/etc/gres.conf"
    i=0
    for spec in $(echo "$gres" | tr ',' ' '); do
        type=${spec%%:*}; count=${spec#*:}
        [ -n "$type" ] && [ "$count" -gt 0 ] 2>/dev/null || die "bad GRES entry '$spec' (want TYPE:COUNT)"
        first=$i
        while [ "$i" -lt $((first + count)) ]; do
            ln -s /dev/null "$dir/dev/nvidia$i"; i=$((i + 1))
        done
        echo "Name=gpu Type=$type File=$dir/dev/nvidia[$first-$((i - 1))]" >>"$dir/etc/gres.conf"
        node_gres="${node_gres:+$node_gres,}gpu:$type:$count"
    done
    jobsubmit=""
    if [ -n "${JOB_SUBMIT_LUA:-}" ]; then
        cp "$JOB_SUBMIT_LUA" "$dir/etc/job_submit.lua"
        jobsubmit="JobSubmitPlugins=lua"
    fi
    cat >"$dir/etc/slurm.conf" <<CONF
ClusterName=mmguard
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$dir/munge/munge.socket.2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
InactiveLimit=0
KillWait=2
MinJobAge=300
$jobsubmit
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=$node_gres ${NODE_MEM:+RealMemory=$NODE_MEM }State=UNKNOWN
${NODE_MEM:+SlurmdParameters=config_overrides}
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
${SLURM_EXTRA:-}
CONF
    cat >"$dir/etc/cgroup.conf" <<CONF
CgroupPlugin=cgroup/v1
CONF
    args=${PLUGIN_ARGS:-}
    if [ -n "${MMGUARD_CONF:-}" ]; then
        cp "$MMGUARD_CONF" "$dir/etc/mmguard.conf"
        chmod 0644 "$dir/etc/mmguard.conf"
        args="config=$dir/etc/mmguard.conf${args:+ $args}"
    fi
    if [ "$plugin" = none ]; then
        : >"$dir/etc/plugstack.conf"
    else
        [ -f "$plugin" ] || die "plugin $plugin not built"
        echo "${PLUGIN_REQUIRED:-required} $plugin $args" >"$dir/etc/plugstack.conf"
    fi
    echo "export SLURM_CONF=$dir/etc/slurm.conf" >"$dir/env.sh"
}

do_start() {
    [ "$(id -u)" -eq 0 ] || die "needs root (slurmd)"
    for b in munged slurmctld slurmd sbatch setpriv; do
        command -v "$b" >/dev/null 2>&1 || die "$b not found (sh scripts/install-deps.sh slurm)"
    done
    do_stop
    case "$dir" in /?*) ;; *) die "CLUSTER_DIR must be absolute" ;; esac
    rm -rf "$dir"
    mkdir -p "$dir/etc" "$dir/state" "$dir/spool" "$dir/run" "$dir/log" "$dir/dev" "$dir/munge"
    chmod 0755 "$dir" "$dir/etc" "$dir/run" "$dir/log"
    chmod 1777 "$dir/log"
    write_configs

    # munged as the munge user with its own key and socket
    chown munge:munge "$dir/munge" && chmod 0700 "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
    chown munge:munge "$dir/munge/munge.key" && chmod 0600 "$dir/munge/munge.key"
    touch "$dir/run/munged.pid" && chown munge "$dir/run/munged.pid"
    setpriv --reuid=munge --regid=munge --clear-groups \
        munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket.2" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/munge/munged.log" \
        --seed-file="$dir/munge/munged.seed" 2>"$dir/log/munged.err" \
        || die "munged failed: $(cat "$dir/log/munged.err")"
    chmod 0755 "$dir/munge"
    wait_for 10 test -S "$dir/munge/munge.socket.2" || die "munged: no socket"

    export SLURM_CONF="$dir/etc/slurm.conf"
    (
        unset MMGUARD_CONF
        [ -n "${CTLD_MMGUARD_CONF:-}" ] && export MMGUARD_CONF="$CTLD_MMGUARD_CONF"
        setsid slurmctld -D -i >"$dir/log/slurmctld.out" 2>&1 </dev/null &
        echo $! >"$dir/run/slurmctld.pid"
    )
    wait_for 15 scontrol ping || { tail -20 "$dir/log/slurmctld.log" >&2 || true; die "slurmctld did not come up"; }
    (
        setsid slurmd -D -N localhost >"$dir/log/slurmd.out" 2>&1 </dev/null &
        echo $! >"$dir/run/slurmd.pid"
    )
    node_up() { sinfo -h -n localhost -o %t | grep -Eq '^(idle|mix|alloc)'; }
    if ! wait_for 30 node_up; then
        tail -20 "$dir/log/slurmd.log" >&2 || true
        die "slurmd did not register"
    fi
    log "up in $dir (source $dir/env.sh; CLUSTER_DIR=$dir to stop it)"
}

case "${1:-}" in
start) do_start ;;
stop) do_stop ;;
status) do_status ;;
restart) do_stop; do_start ;;
*) echo "usage: $0 start|stop|status|restart" >&2; exit 2 ;;
esac
