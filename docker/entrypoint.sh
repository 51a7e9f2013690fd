#!/usr/bin/env bash
# hvdcls-container ROLE: what a container of the hvdcls image does.
#
#   keygen             make this project's SSH key in ~/.ssh (a volume) unless one is there
#   worker             run sshd on $HVDCLS_SSH_PORT so horovodrun/mpirun can start ranks here
#   launcher [CMD...]  wait for the workers in $HVDCLS_WORKERS to answer ssh, then run CMD
#                      (or idle, for `docker-compose exec launcher horovodrun ...`)
#   wait-workers       just the wait: exit 0 once every worker answers, 2 after the timeout
#   service [FLAGS...] wait for the workers, then `hvdcls serve FLAGS` with its state in
#                      $HVDCLS_STATE_DIR, jobs' data under /shared/data, ssh to the workers' port
#   wait-service       exit 0 once the service answers on $HVDCLS_SERVE_URL, 2 after the timeout
#   shell | CMD...     an interactive shell, or any command
set -euo pipefail

PORT="${HVDCLS_SSH_PORT:-12345}"
SSH_DIR="$HOME/.ssh"
WAIT_SECONDS="${HVDCLS_WAIT_SECONDS:-120}"

say() { echo "[hvdcls-container] $*" >&2; }
die() { say "error: $*"; exit 2; }

keygen() {
    # Runs once per project (a one-shot compose service); the key lives only in the volume.
    if [ ! -s "$SSH_DIR/id_ed25519" ]; then
        ssh-keygen -q -t ed25519 -N '' -C "hvdcls-$(hostname)" -f "$SSH_DIR/id_ed25519"
        cp "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
        say "made a new SSH key for this project"
    fi
    # ServerAlive: a host that dies outright (a lost node) closes nothing, so without keep-alives
    # horovodrun's ssh to its workers would hang for TCP's hours, and Horovod's elastic reset
    # with it; with them ssh gives up after ~30-40 s of silence (docs/serve.md, Slurm elastic).
    cat > "$SSH_DIR/config" <<CONFIG
# Written by hvdcls-container keygen: containers of one project trust each other.
Host *
    Port $PORT
    IdentityFile $SSH_DIR/id_ed25519
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    ConnectTimeout 10
    ServerAliveInterval 10
    ServerAliveCountMax 3
CONFIG
    chmod 600 "$SSH_DIR/config" "$SSH_DIR/authorized_keys" "$SSH_DIR/id_ed25519"
}

all_present() {
    local name
    for name in "$@"; do [ -s "$SSH_DIR/$name" ] || return 1; done
}

wait_for_files() {
    for _ in $(seq "$WAIT_SECONDS"); do
        all_present "$@" && return 0
        sleep 1
    done
    die "no $* in $SSH_DIR after ${WAIT_SECONDS} s: did the keygen service run?"
}

worker() {
    # Only authorized_keys: under Kubernetes the MPI Operator's Secret provides it (no config).
    wait_for_files authorized_keys
    # A host key per container start: it never leaves the container, nothing is baked in.
    mkdir -p /tmp/hvdcls-sshd
    ssh-keygen -q -t ed25519 -N '' -f /tmp/hvdcls-sshd/ssh_host_ed25519_key <<< y >/dev/null
    say "sshd on port $PORT"
    exec /usr/sbin/sshd -D -e -p "$PORT" -f /etc/hvdcls/sshd_config
}

wait_workers() {
    wait_for_files authorized_keys config
    local host
    for host in ${HVDCLS_WORKERS//,/ }; do
        host="${host%%:*}"
        local answered=0
        for _ in $(seq "$WAIT_SECONDS"); do
            if ssh -o BatchMode=yes "$host" true 2>/dev/null; then answered=1; break; fi
            sleep 1
        done
        [ "$answered" = 1 ] || die "worker $host does not answer ssh on port $PORT after ${WAIT_SECONDS} s"
    done
}

launcher() {
    wait_workers
    say "workers ready: ${HVDCLS_WORKERS:-none}"
    if [ $# -eq 0 ]; then
        exec sleep infinity
    fi
    exec "$@"
}

service() {
    # A job started before the workers answer would fail: wait as the launcher does.
    wait_workers
    local state="${HVDCLS_STATE_DIR:-/shared/serve}"
    mkdir -p "$state" /shared/data
    say "hvdcls serve: state in $state, data under /shared/data"
    exec hvdcls serve --state-dir "$state" --ssh-port "$PORT" --data-root /shared/data "$@"
}

wait_service() {
    local url="${HVDCLS_SERVE_URL:-http://service:8470}" address
    address="${url#http://}"; address="${address%%/*}"
    for _ in $(seq "$WAIT_SECONDS"); do
        # bash's /dev/tcp: a connection is all we ask, with nothing but bash in the container.
        (exec 3<>"/dev/tcp/${address%:*}/${address##*:}") 2>/dev/null && return 0
        sleep 1
    done
    die "the service does not answer at $url after ${WAIT_SECONDS} s: see its log"
}

role="${1:-shell}"
[ $# -gt 0 ] && shift
case "$role" in
    keygen) keygen ;;
    worker) worker ;;
    launcher) launcher "$@" ;;
    wait-workers) wait_workers ;;
    service) service "$@" ;;
    wait-service) wait_service ;;
    shell) exec bash ;;
    *) exec "$role" "$@" ;;
esac
