#!/usr/bin/env bash
# Issue 48's rehearsal: the GPU host's Horovod build and hvdcls's torch path, run on a CPU host
# before a device lease, so that what would fail there fails here. Not run by CI (too large).
#
#     tools/gpu_rehearsal.sh                    # as root, with Debian's mirror and PyPI reachable
#     ROOT=/tmp/hvdcls-rehearsal LIMIT_S=3600 tools/gpu_rehearsal.sh
#     STEPS="venv cuda check" tools/gpu_rehearsal.sh   # some steps only (the sysroot and the
#                                                      # wheels are reused when present)
#     FIRST=/tmp/hvdcls-rehearsal/out1 STEPS=check tools/gpu_rehearsal.sh   # a second try (PREVIOUS)
#
# The GPU host (KINDS.md; benchmarks/results/2026-12-04-gpu-check/README.md): Ubuntu 24.04 with GCC
# 13.3, Python 3.12.3 at /opt/torch/.venv with numpy 2.5, torch 2.11.0+cu130, nvcc 13.0, the
# nvidia-nccl-cu13 wheel, CMake 4, 16 cores; no TensorFlow, no cffi, no omegaconf, no network.
# What this script has of it here, step by step (each step's seconds in ROOT/rehearsal.json):
#   sysroot  Debian trixie by debootstrap, with g++-13 (13.3.0: the device's compiler and its
#            libstdc++ headers, gcc/g++ pointing at it as on Ubuntu 24.04) and Python 3.13, the
#            nearest to 3.12 that Debian ships (bookworm has 3.11; nothing here has 3.12).
#   wheels   for that Python, downloaded here (pip download --python-version): torch 2.11.0 with
#            its CUDA 13.0 wheels (NCCL, the CUDA runtime), torchvision 0.26.0, numpy 2.5.2, nvcc
#            13.0.88 (nvidia-cuda-nvcc), CMake 4, and those of the device's packages hvdcls's
#            torch path uses. Not cffi and omegaconf: tools/gpu_check.sh --prepare carries them.
#   venv     /opt/torch/.venv in the sysroot (the device's path), from those wheels alone.
#   cuda     /usr/local/cuda in the sysroot laid out of the pip wheels (bin/nvcc, include, lib64
#            with the unversioned libraries CMake looks for), where the device has its toolkit.
#   check    tools/gpu_check.sh under chroot: MODE=cpu HOROVOD_BUILD=nccl, i.e. the GPU mode's
#            build (NCCL, CUDA kernels for sm_90, make -j$(nproc) as horovod_wheel.py sets it:
#            -j2 here, -j16 there), then smoke, the digits, the bench and the input pipeline
#            on the CPU; its OUT is ROOT/out (with the wheel: FIRST=that copy for a second try).
# Measured 2026-12-06 (benchmarks/results/2026-12-06-gpu-rehearsal/README.md): sysroot 194 s, wheels ~300 s
# (2.8 GB), venv 150 s, the build 930 s on 2 loaded cores, the other steps ~4 minutes.
# Everything runs under `nice -n 10`, the whole under LIMIT_S (default 3600 s). The chroot runs
# in a private mount namespace (unshare -m), so its mounts go with it. Exit status: gpu_check's.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ROOT:-/tmp/hvdcls-rehearsal}
LIMIT_S=${LIMIT_S:-3600}
SYSROOT=$ROOT/sysroot
VENV=/opt/torch/.venv  # inside SYSROOT, as on the device
SUITE=trixie
CHROOT_PYTHON=3.13
GCC=13
# The device's versions, as far as PyPI has them for CHROOT_PYTHON.
# nvcc's own parts are pinned with it: unpinned, pip takes crt and nvvm 13.5 beside nvcc 13.0;
# CCCL (nv/target, which cuda_fp16.h includes) is in a toolkit, in a wheel of its own here.
# pip: the newest (the device's is not known), which builds a setup.py-only sdist through PEP 517.
DEVICE_WHEELS=(torch==2.11.0 torchvision==0.26.0 numpy==2.5.2 nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85 "cmake>=4,<5" "pip>=25.3"
    pillow scikit-learn matplotlib tqdm prometheus-client tensorboard psutil cloudpickle pyyaml
    packaging setuptools wheel scikit-build-core pytest)
STARTED=$SECONDS

die() { echo "gpu_rehearsal: error: $*" >&2; exit 2; }
say() { echo "gpu_rehearsal: [$((SECONDS - STARTED)) s] $*"; }

[[ $(id -u) == 0 ]] || die "run as root (debootstrap, chroot, mount)"
command -v debootstrap > /dev/null || die "no debootstrap: apt-get install debootstrap"
mkdir -p "$ROOT/out" "$ROOT/wheels" "$ROOT/logs"

# timed STEP COMMAND...: the command's seconds (and exit status) into ROOT/steps.tsv.
timed() {
    local name=$1 began=$SECONDS rc=0
    shift
    say "$name"
    "$@" > "$ROOT/logs/$name.log" 2>&1 || rc=$?
    printf '%s\t%s\t%s\n' "$name" "$((SECONDS - began))" "$rc" >> "$ROOT/steps.tsv"
    if ((rc != 0)); then
        tail -n 30 "$ROOT/logs/$name.log" >&2
        say "$name failed (exit $rc); log: $ROOT/logs/$name.log"
    fi
    return $rc
}

step_sysroot() {
    if [[ ! -x "$SYSROOT/usr/bin/g++-$GCC" ]]; then
        rm -rf "$SYSROOT"
        nice -n 10 debootstrap --variant=minbase \
            --include="python3,python3-dev,python3-venv,g++-$GCC,gcc-$GCC,make" \
            "$SUITE" "$SYSROOT" http://deb.debian.org/debian
    fi
    # Ubuntu 24.04's default compiler is GCC 13: plain gcc/g++/cc/c++ name it there too.
    local tool
    for tool in gcc g++ cc c++; do
        ln -sf "/usr/bin/$( [[ $tool == g++ || $tool == c++ ]] && echo g++ || echo gcc)-$GCC" \
            "$SYSROOT/usr/local/bin/$tool"
    done
    cp /etc/hosts "$SYSROOT/etc/hosts"  # horovodrun and Gloo resolve this host's name
}

step_wheels() {
    local platforms=() n
    # pip matches manylinux tags exactly: offer every glibc up to the device's (2.39).
    for n in $(seq 17 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    nice -n 10 python3 -m pip download -q -d "$ROOT/wheels" --find-links "$ROOT/wheels" \
        --only-binary=:all: --python-version "$CHROOT_PYTHON" --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 --platform linux_x86_64 "${DEVICE_WHEELS[@]}"
    # Horovod's sdist, and cffi/pycparser/omegaconf as the device run carries them.
    CARRY_PYTHON=$CHROOT_PYTHON PYTHON=python3 "$REPO/tools/gpu_check.sh" --prepare "$ROOT/carry"
}

in_sysroot() {  # in_sysroot COMMAND: bash -c COMMAND under chroot, with the tree's copy read-only
    unshare -m --propagation private bash -s "$SYSROOT" "$ROOT/repo" "$ROOT" "$1" <<'EOF'
set -e
sys=$1 repo=$2 root=$3
mount -t proc proc "$sys/proc"
mount --rbind /dev "$sys/dev"  # /dev/shm: DataLoader workers
mount -t sysfs sysfs "$sys/sys"
mkdir -p "$root/repo"
for dir in repo out wheels carry first; do mkdir -p "$sys/work/$dir"; done
mount --bind "$repo" "$sys/work/repo" && mount -o remount,bind,ro "$sys/work/repo"
mount --bind "$root/out" "$sys/work/out"
mount --bind "$root/wheels" "$sys/work/wheels"
mount --bind "$root/carry" "$sys/work/carry"
[ -d "$root/first" ] && mount --bind "$root/first" "$sys/work/first"
exec chroot "$sys" /usr/bin/env -i HOME=/root TMPDIR=/tmp LANG=C.UTF-8 \
    PATH=/usr/local/bin:/usr/bin:/bin nice -n 10 bash -c "$4"
EOF
}

step_venv() {
    # The device's venv has none of hvdcls's carried needs (cffi, omegaconf): nor does this one.
    in_sysroot "[ -x $VENV/bin/python3 ] || python3 -m venv $VENV
        $VENV/bin/python3 -m pip install -q --no-index --find-links /work/wheels ${DEVICE_WHEELS[*]@Q}
        $VENV/bin/python3 -m pip list --format=freeze"
}

step_cuda() {
    # The pip wheels put CUDA 13 under site-packages/nvidia/cu13 ({bin,include,lib}); a toolkit
    # has lib64/ (where nvcc links its test programs from) and the unversioned library names.
    in_sysroot "set -e
        cu=\$(ls -d $VENV/lib/python3*/site-packages/nvidia/cu13)
        rm -rf /usr/local/cuda && mkdir -p /usr/local/cuda/lib64
        # nvcc finds its libraries from where it lies (nvcc.profile: \$(TOP)/lib64): a copy, not a link.
        cp -r \$cu/bin /usr/local/cuda/bin && ln -s \$cu/include /usr/local/cuda/include
        ln -s \$cu/nvvm /usr/local/cuda/nvvm 2> /dev/null || true
        for lib in \$cu/lib/*.so* \$cu/lib/*.a; do ln -sf \$lib /usr/local/cuda/lib64/; done
        for lib in /usr/local/cuda/lib64/*.so.*; do
            ln -sf \$(readlink \$lib) /usr/local/cuda/lib64/\$(basename \${lib%%.so.*}).so
        done
        ln -s lib64 /usr/local/cuda/lib
        /usr/local/cuda/bin/nvcc --version | tail -n 2; ls /usr/local/cuda/lib64"
}

step_check() {
    local left=$((LIMIT_S - (SECONDS - STARTED)))
    ((left > 300)) || { say "no time left for the check (LIMIT_S=$LIMIT_S)"; return 1; }
    # A copy of the working tree as a device run carries it (tracked and untracked-not-ignored
    # files): what is checked does not change under the run.
    rm -rf "$ROOT/repo" && mkdir -p "$ROOT/repo"
    git -C "$REPO" ls-files -z -co --exclude-standard | tar -C "$REPO" --ignore-failed-read --null -T - -cf - | tar -C "$ROOT/repo" -xf -
    # FIRST: a first try's OUT; this run is then the second try (PREVIOUS), as on the device.
    rm -rf "$ROOT/first"
    [[ -z "${FIRST:-}" ]] || cp -r "$FIRST" "$ROOT/first"
    in_sysroot "cd /work/repo && MODE=cpu HOROVOD_BUILD=nccl PYTHON=$VENV/bin/python3 \
        PREVIOUS=${FIRST:+/work/first} \
        CARRY=/work/carry OUT=/work/out BUDGET_S=$((left - 60)) BUILD_TIMEOUT_S=$((left - 360)) \
        KEEP_WORK=${KEEP_WORK:-} tools/gpu_check.sh"
}

write_record() {
    python3 - "$ROOT" "$SUITE" "$GCC" "$CHROOT_PYTHON" "$(nproc)" <<'EOF'
import json, sys
from pathlib import Path
root, suite, gcc, python, jobs = sys.argv[1:]
rows = [line.split("\t") for line in Path(root, "steps.tsv").read_text().splitlines()]
record = {"sysroot": f"Debian {suite}, g++-{gcc}", "python": python, "make_jobs": int(jobs),
          "steps": {name: {"seconds": int(s), "rc": int(rc)} for name, s, rc in rows}}
Path(root, "rehearsal.json").write_text(json.dumps(record, indent=2) + "\n")
print(json.dumps(record))
EOF
}

rm -f "$ROOT/steps.tsv"
rc=0
for step in ${STEPS:-sysroot wheels venv cuda check}; do
    timed "$step" "step_$step" || { rc=$?; break; }
done
write_record
say "done (exit $rc); gpu_check's results: $ROOT/out/summary.json"
exit $rc
