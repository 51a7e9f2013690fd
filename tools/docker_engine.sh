#!/usr/bin/env bash
# Make sure a Docker engine answers, starting one when none does.
#
#   tools/docker_engine.sh          # required: exit 2 with one line when no engine can be had
#   tools/docker_engine.sh --try    # best effort: say why not, exit 0 (the docker tests then skip)
#
# On a machine without an engine (as root, with apt-get) this installs Debian's docker.io and
# docker-compose and starts dockerd in the background with the overlay2 storage driver: overlay
# shares layers between images, where vfs copies every layer in full (an 8 GB image cost 33 GB
# of disk under vfs here). An engine that already answers is used as it is.
set -euo pipefail

MODE=require
[ "${1:-}" = "--try" ] && MODE=try
LOG="${HVDCLS_DOCKERD_LOG:-/var/log/hvdcls-dockerd.log}"
STORAGE_DRIVER="${HVDCLS_DOCKER_STORAGE_DRIVER:-overlay2}"

say() { echo "[docker] $*"; }
give_up() {
    if [ "$MODE" = try ]; then
        say "no Docker engine: $* (the docker tests will skip)"
        exit 0
    fi
    echo "[docker] error: $*" >&2
    exit 2
}

engine_answers() { command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; }

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v docker-compose >/dev/null || missing+=(docker-compose)
    # `make base-image` builds the base image from Debian's packages with debootstrap.
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || give_up "not root, and ${missing[*]} missing: install them (Debian: apt-get install ${missing[*]})"
    command -v apt-get >/dev/null || give_up "${missing[*]} missing and no apt-get to install them"
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq || give_up "apt-get update failed: check the package mirror"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || give_up "apt-get install ${missing[*]} failed"
}

start_dockerd() {
    [ "$(id -u)" -eq 0 ] || give_up "no engine answers and dockerd must be started as root (or add your user to the docker group of a running engine)"
    say "starting dockerd (storage driver $STORAGE_DRIVER, log $LOG)"
    # setsid: the engine outlives this script, make and the CI job's shell.
    setsid nohup dockerd --storage-driver="$STORAGE_DRIVER" >"$LOG" 2>&1 < /dev/null &
    for _ in $(seq 60); do
        engine_answers && return 0
        sleep 1
    done
    give_up "dockerd did not answer within 60 s: see $LOG ($(tail -n 1 "$LOG" 2>/dev/null))"
}

if engine_answers; then
    install_packages  # docker-compose and debootstrap may still be missing
    exit 0
fi
install_packages
start_dockerd
say "engine ready: $(docker info --format '{{.ServerVersion}}, {{.Driver}}')"
