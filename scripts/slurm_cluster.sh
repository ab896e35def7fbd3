#!/usr/bin/env bash
# Throwaway single-node SLURM cluster on 127.0.0.1, for CI (pytest fixture).
#
# Usage (as root):
#   scripts/slurm_cluster.sh start  STATE_DIR   # install if needed, configure, start, wait for idle node
#   scripts/slurm_cluster.sh status STATE_DIR   # print sinfo; exit 0 if the node is idle/mixed/allocated
#   scripts/slurm_cluster.sh stop   STATE_DIR   # kill exactly the daemons recorded in STATE_DIR/pids
#
# Exit codes: 0 ok; 1 failure (daemon logs are printed); 2 usage error;
#             3 environment cannot host the cluster (not root, no apt-get, or the
#               packages could not be installed) -- the pytest fixture skips on 3.
#
# The last line printed by `start` is `export SLURM_CONF=STATE_DIR/slurm.conf`.
#
# Choices:
# * Packages (Debian 12: Slurm 22.05, MariaDB 10.11) are installed with apt-get
#   only when a binary is missing. A temporary /usr/sbin/policy-rc.d (exit 101)
#   stops the packages from starting their own services when none exists yet.
# * Configuration lives in STATE_DIR: slurm.conf, slurmdbd.conf (0600, root).
#   slurmctld/slurmd get `-f STATE_DIR/slurm.conf`; every daemon and client is
#   run with SLURM_CONF=STATE_DIR/slurm.conf (slurmdbd finds slurmdbd.conf next
#   to it). Callers must export SLURM_CONF (printed last by `start`). A copy is
#   also installed as /etc/slurm/slurm.conf so clients that lose the environment
#   (login shells, `sbatch --export=NONE` jobs) still reach this cluster; `stop`
#   removes that copy again when it is still ours.
# * Job accounting: slurmdbd backed by a private MariaDB server (datadir
#   STATE_DIR/mariadb, TCP 127.0.0.1:$FGLCI_MARIADB_PORT, default 3307, so it
#   never collides with a system MariaDB on 3306). This makes plain `sacct` work,
#   which snakemake-executor-plugin-slurm uses for status polling whenever sacct
#   is on PATH. Account `fglci` is created and root (plus $SUDO_USER and
#   $FGLCI_SLURM_USERS) are added to it as default account, so the plugin's
#   account guessing/validation (sacct/sacctmgr) succeeds.
# * Munge uses the standard paths (/etc/munge/munge.key, /run/munge socket),
#   because clients look there by default. If a munged is already answering,
#   it is reused and not recorded (so `stop` leaves it alone).
# * Daemons run as root (SlurmUser=SlurmdUser=root; mariadbd --user=root),
#   munged as user munge. PIDs come from each daemon's pid file (all under
#   STATE_DIR/run except munged's /run/munge/munged.pid) and are appended to
#   STATE_DIR/pids (`name pid`) as soon as each daemon is up, so a failed start
#   can always be torn down. `stop` checks /proc/PID/comm before killing, so a
#   recycled PID is never hit, and never kills by name.
# * Node definition: topology (CPUs, Boards, Sockets, Cores, Threads) is taken
#   from `slurmd -C`, so slurmd's registration always matches (hand-written
#   CPUs=N drains the node on hyper-threaded hosts); RealMemory is 90% of what
#   `slurmd -C` reports. Partition `debug` (default), no GRES/GPUs.
# * Ports (env overridable): FGLCI_SLURMCTLD_PORT=6817, FGLCI_SLURMD_PORT=6818,
#   FGLCI_SLURMDBD_PORT=6819, FGLCI_MARIADB_PORT=3307. Only one cluster per
#   host at a time; `start` refuses if a port is already taken.
# * If `start` fails, the daemons it started are stopped again (set
#   FGLCI_KEEP_ON_FAILURE=1 to keep them for debugging). Logs: STATE_DIR/log.
set -euo pipefail

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"

CLUSTER_NAME=fglci
ACCOUNT_NAME=fglci
PARTITION_NAME=debug
CTLD_PORT=${FGLCI_SLURMCTLD_PORT:-6817}
SLURMD_PORT=${FGLCI_SLURMD_PORT:-6818}
DBD_PORT=${FGLCI_SLURMDBD_PORT:-6819}
DB_PORT=${FGLCI_MARIADB_PORT:-3307}
IDLE_TIMEOUT=${FGLCI_IDLE_TIMEOUT:-90}   # seconds to wait for the node to become idle
MUNGE_PIDFILE=/run/munge/munged.pid
ETC_SLURM_CONF=/etc/slurm/slurm.conf

REQUIRED_BINS=(munged munge unmunge slurmctld slurmd slurmdbd sbatch sacct sacctmgr sinfo squeue scancel
               mariadbd mariadb mariadb-admin mariadb-install-db)
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)

log() { echo "[slurm_cluster] $*" >&2; }
die() { echo "[slurm_cluster] ERROR: $1" >&2; exit "${2:-1}"; }

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# ---------------------------------------------------------------- paths --
set_paths() {
    STATE_DIR=$(realpath -m -- "$1")
    CONF="$STATE_DIR/slurm.conf"
    DBD_CONF="$STATE_DIR/slurmdbd.conf"
    PIDS="$STATE_DIR/pids"
    LOG_DIR="$STATE_DIR/log"
    RUN_DIR="$STATE_DIR/run"
    DB_DIR="$STATE_DIR/mariadb"
    DB_SOCK="$DB_DIR/mysqld.sock"
    export SLURM_CONF="$CONF"
}

# --------------------------------------------------------------- install --
missing_bins() {
    local b out=()
    for b in "${REQUIRED_BINS[@]}"; do
        command -v "$b" >/dev/null 2>&1 || out+=("$b")
    done
    echo "${out[*]:-}"
}

install_packages() {
    local missing
    missing=$(missing_bins)
    [ -z "$missing" ] && return 0
    log "missing: $missing -> installing ${PACKAGES[*]}"
    command -v apt-get >/dev/null 2>&1 || die "apt-get not available; cannot install SLURM (missing: $missing)" 3
    local made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        # keep the packages from starting their own (system-wide) services
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local rc=0
    {
        apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
    } >"${TMPDIR:-/tmp}/slurm_cluster_apt.log" 2>&1 || rc=$?
    [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    if [ "$rc" != 0 ]; then
        tail -n 20 "${TMPDIR:-/tmp}/slurm_cluster_apt.log" >&2 || true
        die "apt-get failed (rc=$rc); cannot install SLURM" 3
    fi
    missing=$(missing_bins)
    [ -z "$missing" ] || die "still missing after install: $missing" 3
    log "packages installed"
}

# ----------------------------------------------------------- pid helpers --
# wait_for_pidfile FILE SECONDS -> prints the pid once FILE holds a live pid
wait_for_pidfile() {
    local f=$1 end=$((SECONDS + $2)) pid
    while [ "$SECONDS" -lt "$end" ]; do
        if [ -s "$f" ]; then
            pid=$(head -n1 "$f" | tr -dc 0-9)
            if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
                echo "$pid"
                return 0
            fi
        fi
        sleep 0.2
    done
    return 1
}

record_pid() { echo "$1 $2" >>"$PIDS"; }

# pid_matches NAME PID: the process PID is alive and its comm is NAME
pid_matches() {
    local comm
    comm=$(cat "/proc/$2/comm" 2>/dev/null) || return 1
    [ "$comm" = "$1" ]
}

port_in_use() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# wait_until SECONDS PID NAME CMD...: poll CMD until it succeeds; die when daemon PID
# dies or SECONDS pass.
wait_until() {
    local limit=$1 pid=$2 name=$3
    shift 3
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || die "$name does not answer"
        kill -0 "$pid" 2>/dev/null || die "$name died"
        sleep 0.3
    done
}

# ----------------------------------------------------------------- munge --
start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating /etc/munge/munge.key"
        install -d -m 0700 -o munge -g munge /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    install -d -m 0755 -o munge -g munge /run/munge
    install -d -m 0700 -o munge -g munge /var/log/munge
    install -d -m 0711 -o munge -g munge /var/lib/munge

    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munged already running (not started by us, will not be stopped)"
        return 0
    fi
    rm -f "$MUNGE_PIDFILE"
    setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --num-threads=2 \
        </dev/null >>"$LOG_DIR/munged.stdout" 2>&1 || die "munged failed to start (see /var/log/munge/munged.log)"
    local pid
    pid=$(wait_for_pidfile "$MUNGE_PIDFILE" 10) || die "munged wrote no pid file"
    record_pid munged "$pid"
    local end=$((SECONDS + 10))
    until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || die "munge credential round-trip fails"
        sleep 0.2
    done
    log "munged up (pid $pid)"
}

# --------------------------------------------------------------- mariadb --
db_sql() { mariadb --no-defaults --protocol=socket -S "$DB_SOCK" -uroot -e "$1"; }

start_mariadb() {
    mkdir -p "$DB_DIR/tmp"
    if [ ! -d "$DB_DIR/data/mysql" ]; then
        log "initialising MariaDB datadir $DB_DIR/data"
        rm -rf "$DB_DIR/data"
        mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR/data" \
            --auth-root-authentication-method=socket --skip-test-db --skip-name-resolve \
            >"$LOG_DIR/mariadb-install-db.log" 2>&1 ||
            { tail -n 20 "$LOG_DIR/mariadb-install-db.log" >&2; die "mariadb-install-db failed"; }
    fi
    rm -f "$DB_DIR/mariadbd.pid"
    # --no-defaults must come first; setsid detaches it from the caller's session
    setsid mariadbd --no-defaults --user=root --datadir="$DB_DIR/data" --tmpdir="$DB_DIR/tmp" \
        --socket="$DB_SOCK" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$DB_DIR/mariadbd.pid" --log-error="$LOG_DIR/mariadb.log" \
        --innodb-buffer-pool-size=128M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
        --performance-schema=OFF --skip-log-bin --max-connections=64 \
        </dev/null >>"$LOG_DIR/mariadb.stdout" 2>&1 &
    local pid
    pid=$(wait_for_pidfile "$DB_DIR/mariadbd.pid" 30) || die "mariadbd did not start"
    record_pid mariadbd "$pid"
    wait_until 30 "$pid" mariadbd mariadb-admin --no-defaults --protocol=socket -S "$DB_SOCK" -uroot ping
    log "mariadbd up (pid $pid, 127.0.0.1:$DB_PORT)"
}

# --------------------------------------------------------------- slurmdbd --
db_password() {
    if [ -s "$DBD_CONF" ] && grep -q '^StoragePass=' "$DBD_CONF"; then
        sed -n 's/^StoragePass=//p' "$DBD_CONF" | head -n1
    else
        od -An -N16 -tx1 /dev/urandom | tr -d ' \n'
    fi
}

start_slurmdbd() {
    local pw
    pw=$(db_password)
    db_sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
            ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
            ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pw';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || die "could not create the accounting database"
    (
        umask 077
        cat >"$DBD_CONF" <<EOF
# generated by scripts/slurm_cluster.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pw
StorageLoc=slurm_acct_db
EOF
    )
    chown root:root "$DBD_CONF"
    chmod 0600 "$DBD_CONF"
    rm -f "$RUN_DIR/slurmdbd.pid"
    slurmdbd </dev/null >>"$LOG_DIR/slurmdbd.stdout" 2>&1 || die "slurmdbd failed to start"
    local pid
    pid=$(wait_for_pidfile "$RUN_DIR/slurmdbd.pid" 20) || die "slurmdbd wrote no pid file"
    record_pid slurmdbd "$pid"
    wait_until 45 "$pid" slurmdbd timeout 10 sacctmgr -n -P list cluster format=cluster
    log "slurmdbd up (pid $pid, 127.0.0.1:$DBD_PORT)"
}

setup_accounting() {
    local u users known=()
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
        sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
    fi
    if ! sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT_NAME"; then
        sacctmgr -i add account "$ACCOUNT_NAME" Cluster="$CLUSTER_NAME" \
            Description="CI account" Organization=ci >/dev/null
    fi
    users="root ${SUDO_USER:-} ${FGLCI_SLURM_USERS:-}"
    for u in $users; do
        id "$u" >/dev/null 2>&1 || continue
        known+=("$u")
        if ! sacctmgr -n -P list assoc user="$u" account="$ACCOUNT_NAME" format=user | grep -qx "$u"; then
            sacctmgr -i add user "$u" Account="$ACCOUNT_NAME" DefaultAccount="$ACCOUNT_NAME" \
                Cluster="$CLUSTER_NAME" >/dev/null
        fi
    done
    log "accounting: cluster $CLUSTER_NAME, account $ACCOUNT_NAME, users: ${known[*]}"
}

# ------------------------------------------------------------ slurm.conf --
write_slurm_conf() {
    local node host_line cpus boards sockets cores threads mem
    node=$(hostname -s)
    host_line=$(env -u SLURM_CONF slurmd -C 2>/dev/null | grep -m1 '^NodeName=' || true)
    field() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$host_line"; }
    cpus=$(field CPUs); boards=$(field Boards); sockets=$(field SocketsPerBoard)
    cores=$(field CoresPerSocket); threads=$(field ThreadsPerCore); mem=$(field RealMemory)
    [ -n "$cpus" ] || cpus=$(nproc)
    [ -n "$mem" ] || mem=$(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo)
    mem=$((mem * 9 / 10))
    local topo=""
    if [ -n "$boards" ] && [ -n "$sockets" ] && [ -n "$cores" ] && [ -n "$threads" ]; then
        topo=" Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads"
    fi
    cat >"$CONF" <<EOF
# generated by scripts/slurm_cluster.sh for a throwaway CI cluster
ClusterName=$CLUSTER_NAME
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
MinJobAge=300
ReturnToService=2
KillWait=5
InactiveLimit=0
# accounting: slurmdbd + private MariaDB, so plain sacct works
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus$topo RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION_NAME Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    mkdir -p "$(dirname "$ETC_SLURM_CONF")"
    cp -f "$CONF" "$ETC_SLURM_CONF"
}

# ------------------------------------------------------- slurmctld/slurmd --
start_slurm_daemons() {
    local pid node
    node=$(hostname -s)
    rm -f "$RUN_DIR/slurmctld.pid" "$RUN_DIR/slurmd.pid"
    slurmctld -f "$CONF" </dev/null >>"$LOG_DIR/slurmctld.stdout" 2>&1 || die "slurmctld failed to start"
    pid=$(wait_for_pidfile "$RUN_DIR/slurmctld.pid" 20) || die "slurmctld wrote no pid file"
    record_pid slurmctld "$pid"
    log "slurmctld up (pid $pid)"
    slurmd -f "$CONF" -N "$node" </dev/null >>"$LOG_DIR/slurmd.stdout" 2>&1 || die "slurmd failed to start"
    pid=$(wait_for_pidfile "$RUN_DIR/slurmd.pid" 20) || die "slurmd wrote no pid file"
    record_pid slurmd "$pid"
    log "slurmd up (pid $pid)"
}

node_state() { timeout 15 sinfo -h -o %T 2>/dev/null | head -n1; }

wait_idle() {
    local end=$((SECONDS + IDLE_TIMEOUT)) st=""
    while [ "$SECONDS" -lt "$end" ]; do
        st=$(node_state || true)
        [ "$st" = idle ] && return 0
        sleep 1
    done
    log "node not idle after ${IDLE_TIMEOUT}s (state: '${st:-unknown}')"
    return 1
}

dump_logs() {
    local f
    for f in "$LOG_DIR"/*.log /var/log/munge/munged.log; do
        [ -s "$f" ] || continue
        [ "${f##*/}" = mariadb-install-db.log ] && continue
        echo "----- tail $f -----" >&2
        tail -n 25 "$f" >&2 || true
    done
}

all_recorded_alive() {
    [ -s "$PIDS" ] || return 1
    local name pid
    while read -r name pid; do
        pid_matches "$name" "$pid" || return 1
    done <"$PIDS"
}

# --------------------------------------------------------------- commands --
on_start_failure() {
    local rc=$?
    trap - EXIT
    if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
        dump_logs
        if [ "${FGLCI_KEEP_ON_FAILURE:-0}" != 1 ]; then
            log "start failed (rc=$rc); stopping what was started"
            cmd_stop || true
        fi
    fi
    exit "$rc"
}

cmd_start() {
    [ "$(id -u)" = 0 ] || die "must run as root to install and start SLURM" 3
    install_packages

    mkdir -p "$STATE_DIR"
    if all_recorded_alive && cmd_status >/dev/null 2>&1; then
        log "cluster already running from $STATE_DIR"
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    if [ -s "$PIDS" ]; then
        log "stale/partial cluster in $STATE_DIR; stopping it first"
        cmd_stop
    fi
    local p
    for p in "$CTLD_PORT" "$SLURMD_PORT" "$DBD_PORT" "$DB_PORT"; do
        port_in_use "$p" && die "port $p on 127.0.0.1 is already in use (another cluster running? stop it first)"
    done

    trap on_start_failure EXIT
    mkdir -p "$LOG_DIR" "$RUN_DIR" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd"
    : >"$PIDS"
    local t0=$SECONDS
    write_slurm_conf
    start_munge
    start_mariadb
    start_slurmdbd
    setup_accounting
    start_slurm_daemons
    wait_idle || exit 1
    timeout 15 sacct -n -X >/dev/null || die "sacct does not work"
    trap - EXIT
    log "cluster $CLUSTER_NAME ready in $((SECONDS - t0))s: partition $PARTITION_NAME, node $(hostname -s)," \
        "$(sed -n 's/.* CPUs=\([0-9]*\).*RealMemory=\([0-9]*\).*/CPUs=\1 RealMemory=\2MB/p' "$CONF")"
    timeout 15 sinfo >&2 || true
    echo "export SLURM_CONF=$CONF"
}

# stop_pid NAME PID: SIGTERM, wait up to 10 s, then SIGKILL (only if still NAME)
stop_pid() {
    local name=$1 pid=$2 end
    if ! pid_matches "$name" "$pid"; then
        log "$name (pid $pid) not running"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    end=$((SECONDS + 10))
    while pid_matches "$name" "$pid" && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
    if pid_matches "$name" "$pid"; then
        log "$name (pid $pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    log "stopped $name (pid $pid)"
}

cancel_jobs() {
    # Jobs' slurmstepd processes are not children we recorded: cancel all jobs
    # while slurmctld/slurmd are still up so that they exit on their own.
    local ids end
    ids=$(timeout 15 squeue -h -o %i 2>/dev/null || true)
    [ -n "$ids" ] || return 0
    log "cancelling jobs: ${ids//$'\n'/ }"
    # shellcheck disable=SC2086
    timeout 15 scancel $ids 2>/dev/null || true
    end=$((SECONDS + 20))
    while [ -n "$(timeout 15 squeue -h -o %i 2>/dev/null || true)" ] && [ "$SECONDS" -lt "$end" ]; do
        sleep 1
    done
}

cmd_stop() {
    if [ ! -s "$PIDS" ]; then
        log "nothing recorded in $PIDS; nothing to stop"
        return 0
    fi
    if [ -s "$CONF" ] && grep -q '^slurmctld ' "$PIDS"; then
        cancel_jobs
    fi
    # stop in reverse start order: slurmd, slurmctld, slurmdbd, mariadbd, munged
    local name pid
    while read -r name pid; do
        [ -n "$name" ] && [ -n "$pid" ] || continue
        stop_pid "$name" "$pid"
    done < <(tac "$PIDS")
    mv -f "$PIDS" "$PIDS.stopped"
    if [ -f "$ETC_SLURM_CONF" ] && [ -f "$CONF" ] && cmp -s "$ETC_SLURM_CONF" "$CONF"; then
        rm -f "$ETC_SLURM_CONF"
    fi
    local left
    left=$(pgrep -a slurmstepd 2>/dev/null || true)
    [ -z "$left" ] || log "WARNING: slurmstepd processes still present: $left"
    log "cluster in $STATE_DIR stopped"
}

cmd_status() {
    [ -s "$CONF" ] || { echo "no cluster configured in $STATE_DIR"; return 1; }
    if ! all_recorded_alive; then
        echo "cluster in $STATE_DIR is not running (daemons in $PIDS missing or dead)"
        return 1
    fi
    timeout 15 sinfo || true
    local st
    st=$(node_state || true)
    case "$st" in
        idle | mixed | allocated) return 0 ;;
        *) return 1 ;;
    esac
}

main() {
    [ $# -eq 2 ] || usage
    local cmd=$1
    set_paths "$2"
    case "$cmd" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        *) usage ;;
    esac
}

main "$@"
