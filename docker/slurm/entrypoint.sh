#!/usr/bin/env bash
# hvdcls-slurm ROLE: what a container of the hvdcls Slurm image does (docker/slurm.yaml).
#
#   munge-key    make this project's munge key in /etc/munge (a volume) unless one is there
#   controller   munged + slurmctld
#   node         munged + sshd for user hvd (horovodrun between the nodes) + slurmd
#   service      munged, wait for both nodes to be idle, then `hvdcls serve --executor slurm`
#                as hvd (state in $HVDCLS_STATE_DIR on the shared volume)
#   wait-ready   exit 0 once every node is idle in Slurm and the service answers, 2 after the timeout
#   shell | CMD...
set -euo pipefail

KEY=/etc/munge/munge.key
WAIT_SECONDS="${HVDCLS_WAIT_SECONDS:-120}"
NODES="${HVDCLS_SLURM_NODES:-2}"

say() { echo "[hvdcls-slurm] $*" >&2; }
die() { say "error: $*"; exit 2; }
as_hvd() { runuser -u hvd -- env HOME=/home/hvd USER=hvd LOGNAME=hvd "$@"; }

munge_key() {
    # One per project, made at start-up: munge authenticates every Slurm message with it.
    if [ ! -s "$KEY" ]; then
        (umask 077 && head -c 1024 /dev/urandom > "$KEY.new")
        chown munge:munge "$KEY.new" && chmod 0400 "$KEY.new" && mv "$KEY.new" "$KEY"
        say "made a new munge key for this project"
    fi
}

start_munged() {
    for _ in $(seq "$WAIT_SECONDS"); do [ -s "$KEY" ] && break; sleep 1; done
    [ -s "$KEY" ] || die "no $KEY after ${WAIT_SECONDS} s: did the munge-key service run?"
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- munged
}

wait_idle() {
    local idle=0
    for _ in $(seq "$WAIT_SECONDS"); do
        idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
        [ "$idle" -ge "$NODES" ] && return 0
        sleep 1
    done
    die "$idle of $NODES nodes idle in Slurm after ${WAIT_SECONDS} s"
}

wait_ready() {
    wait_idle
    for _ in $(seq "$WAIT_SECONDS"); do
        [ -s "$HVDCLS_STATE_DIR/server.json" ] && { say "ready: $(cat "$HVDCLS_STATE_DIR/server.json")"; return 0; }
        sleep 1
    done
    die "no $HVDCLS_STATE_DIR/server.json after ${WAIT_SECONDS} s: see the service's log"
}

role="${1:-shell}"
[ $# -gt 0 ] && shift
case "$role" in
    munge-key) munge_key ;;
    controller) start_munged; exec slurmctld -D ;;
    node)
        start_munged
        as_hvd hvdcls-container worker &  # sshd on $HVDCLS_SSH_PORT, key from the ssh volume
        exec slurmd -D ;;
    service)
        start_munged
        wait_idle
        install -d -o hvd -g hvd "$HVDCLS_STATE_DIR" /shared/data
        exec runuser -u hvd -- env HOME=/home/hvd USER=hvd LOGNAME=hvd \
            hvdcls serve --executor slurm --partition debug --data-root /shared/data "$@" ;;
    wait-ready) wait_ready ;;
    shell) exec bash ;;
    *) exec "$role" "$@" ;;
esac
