#!/usr/bin/env bash
# `make base-image`: a Debian bookworm + Python 3.11 base image, made from Debian's packages for
# machines that reach no image registry (where `FROM python:3.11-slim` cannot be pulled).
#
#   debootstrap --variant=minbase bookworm ROOTFS MIRROR  ->  tar | docker import  ->  BASE_IMAGE
#
# The result plays the part of python:3.11-slim: a minimal Debian with python3 and venv; the
# Dockerfile adds OpenMPI and SSH on top with apt-get, the same way for both bases. An image of
# that name that already exists is kept (REBUILD=1 makes it again).
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-hvdcls/base:bookworm}"
SUITE="${SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
REBUILD="${REBUILD:-0}"

say() { echo "[base-image] $*"; }
die() { echo "[base-image] error: $*" >&2; exit 2; }

if [ "$REBUILD" != 1 ] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "$BASE_IMAGE exists (REBUILD=1 makes it again)"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap"

started=$(date +%s)
rootfs=$(mktemp -d /var/tmp/hvdcls-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
say "debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 \
    || { tail -n 5 "$rootfs.log" >&2; die "debootstrap failed (log: $rootfs.log)"; }
rm -f "$rootfs.log"
# An image does not need apt's downloaded packages or lists; `apt-get update` fetches lists anew.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $SUITE + python3" - "$BASE_IMAGE" >/dev/null
size=$(docker image inspect --format '{{.Size}}' "$BASE_IMAGE")
say "$BASE_IMAGE built in $(( $(date +%s) - started )) s, $(( size / 1000000 )) MB"
