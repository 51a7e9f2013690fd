#!/usr/bin/env bash
# Issues 15 and 48's GPU check: on a bare NVIDIA host with a Python that has torch and no network,
# build Horovod with NCCL, then smoke, train and bench hvdcls on the GPU: a first try in under 6
# minutes, a second that runs only what the first did not pass (both and two starts: 15 minutes).
#
#     tools/gpu_check.sh --prepare [DIR]    # HERE, with network: the sdist + wheels to carry
#                                           # (default DIR: build/gpu_carry, ignored by git)
#     OUT=results MODE=gpu tools/gpu_check.sh                          # the first try, on the GPU host
#     OUT=results2 PREVIOUS=build/gpu_carry/first MODE=gpu tools/gpu_check.sh   # the second
#     OUT=results MODE=cpu HOROVOD_BUILD=reuse tools/gpu_check.sh      # the same steps, tiny, on a CPU
#     OUT=results MODE=cpu HOROVOD_BUILD=nccl tools/gpu_check.sh       # + the GPU build (rehearsal)
#
# Steps, each under `timeout`, each writing OUT/<step>.json (ok, seconds, CPU seconds, numbers,
# problems, the log's tail when it failed); a failed step is recorded and the script goes on.
# The GPU mode's budget per step (seconds: planned / cap), from the rehearsal on 2026-12-06
# (tools/gpu_rehearsal.sh; docs/benchmarks.md, "The rehearsal"):
#   build     130 / 200  Horovod 0.28.1 from the carried sdist through tools/horovod_wheel.py:
#             PyTorch only, Gloo, every core; gpu (and HOROVOD_BUILD=nccl): NCCL (torch's
#             nvidia-nccl wheel), CUDA kernels for CUDA_CC (90); into a temporary prefix, and the
#             wheel into OUT. cpu: HOROVOD_BUILD=reuse takes the Horovod already installed.
#   install     5 / 15   the carried wheels (omegaconf; cffi, which the build installs first) into
#             the same prefix; what imports, NCCL or not.
#   smoke      20 / 45   `hvdcls smoke --backend torch` under horovodrun --gloo, np=1, and one
#             Horovod all-reduce of a tensor on the device (NCCL in gpu mode).
#   train      30 / 60   `hvdcls train --backend torch training.device=cuda|cpu`, digits (>= 0.95).
#   bench      75 / 120  `hvdcls bench --device cuda|cpu`: hvdcls, raw Horovod, the plain torch
#             loop (DDP, world of one); gpu: ResNet-50, 224 px, batch 256, float16 AMP, channels-last.
#   pipeline   25 / 40   the input pipeline alone: hvdcls's loader beside torchvision's ImageFolder +
#             DataLoader on the same 1,024 JPEGs (benchmarks/input_pipeline.py), images/s per core.
#   In all   285 planned, BUDGET_S=330 bounds them (the caps only stop a hung step early).
# Then OUT/summary.json (and the table, summary.md, on stdout: issue 15's targets met or not).
# OUT holds at most 8 files, what a device run brings back: the six step records, summary.json
# and, when built, the Horovod wheel (debug info stripped so it fits the 16 MiB a file). The
# rest goes to a temporary WORK directory. Exit 0 when every step is ok, 1 when one failed, 2
# on bad input.
#
# The second try: copy the first try's files as they came back into the carried directory
# (e.g. build/gpu_carry/first/) and name it PREVIOUS. Its wheel is installed instead of building
# (~10 s); smoke, train, bench and pipeline records that passed are carried over ("previous":
# true, no seconds counted); the rest run again.
#
# Settings (environment): MODE=gpu|cpu (default gpu), OUT (default runs/gpu_check), PYTHON
# (default python3), CARRY (default build/gpu_carry), HOROVOD_BUILD=build|nccl|reuse (the
# last two cpu only), PREVIOUS (the first try's OUT), BUDGET_S (seconds for all steps; default
# 330 gpu, 900 cpu), SKIP_STEPS (e.g. "train pipeline", recorded as skipped), LOADER_WORKERS
# (default cores-1), CUDA_CC (default 90: H100/H200), BUILD_TIMEOUT_S (the build step's cap;
# default 200 gpu, 400 cpu), KEEP_WORK=1 keeps WORK; for --prepare, CARRY_PYTHON (default 3.12,
# the GPU host's: the Python the carried binary wheels are for).
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
HOROVOD_VERSION=0.28.1
SDIST_NAME=horovod-$HOROVOD_VERSION.tar.gz
# The GPU host's Python (KINDS.md: Python 3.12) and what it lacks of hvdcls's needs; PyYAML,
# cloudpickle, psutil, packaging are there already (its package list). cffi (with pycparser) is
# not, and Horovod's setup.py asks for it at build time (setup_requires): without it the build
# tries to fetch it and fails at once on a host with no network (seen on the H200, 2026-12-04).
CARRY_WHEELS=(omegaconf==2.4.0 cffi==2.1.1 pycparser==3.12)

die() { echo "gpu_check: error: $*" >&2; exit 2; }

prepare() {
    local dir=${1:-$REPO/build/gpu_carry} py=${PYTHON:-python3}
    mkdir -p "$dir" || die "cannot create $dir"
    "$py" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$dir" \
        || die "pip download of the Horovod sdist failed"
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${CARRY_PYTHON:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dir" "${CARRY_WHEELS[@]}" || die "pip download of ${CARRY_WHEELS[*]} failed"
    local kib
    kib=$(du -sk "$dir" | cut -f1)
    (( kib < 60 * 1024 )) || die "$dir is $((kib / 1024)) MiB: over what a device run carries (64 MiB)"
    ls -l "$dir"
    echo "gpu_check: $dir ready ($((kib / 1024)) MiB); run with carry [\"${dir#"$REPO"/}\"]"
}

if [[ "${1:-}" == "--prepare" ]]; then
    prepare "${2:-}"
    exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (use --prepare [DIR], or no arguments)"

MODE=${MODE:-gpu}
[[ "$MODE" == gpu || "$MODE" == cpu ]] || die "MODE must be gpu or cpu, not '$MODE'"
HOROVOD_BUILD=${HOROVOD_BUILD:-build}
[[ "$HOROVOD_BUILD" == build || "$HOROVOD_BUILD" == reuse || "$HOROVOD_BUILD" == nccl ]] \
    || die "HOROVOD_BUILD must be build, nccl or reuse, not '$HOROVOD_BUILD'"
[[ "$MODE" == gpu && "$HOROVOD_BUILD" != build ]] \
    && die "HOROVOD_BUILD=$HOROVOD_BUILD is for MODE=cpu: the GPU mode always builds (with NCCL)"
PY=${PYTHON:-python3}
command -v "$PY" > /dev/null || die "no Python '$PY' (set PYTHON)"
CARRY=${CARRY:-$REPO/build/gpu_carry}
[[ "$CARRY" == /* ]] || CARRY=$REPO/$CARRY
if [[ "$HOROVOD_BUILD" != reuse ]]; then
    [[ -f "$CARRY/$SDIST_NAME" ]] || die "missing $CARRY/$SDIST_NAME: run tools/gpu_check.sh --prepare here first and carry it"
fi
if [[ "$MODE" == gpu ]]; then
    for name in omegaconf cffi pycparser; do
        compgen -G "$CARRY/$name-*.whl" > /dev/null || die "missing the $name wheel in $CARRY: run tools/gpu_check.sh --prepare"
    done
    command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q '^GPU ' \
        || die "MODE=gpu needs an NVIDIA GPU (nvidia-smi -L lists none)"
fi
PREVIOUS=${PREVIOUS:-}
if [[ -n "$PREVIOUS" ]]; then
    [[ "$PREVIOUS" == /* ]] || PREVIOUS=$PWD/$PREVIOUS
    compgen -G "$PREVIOUS/*.json" > /dev/null \
        || die "PREVIOUS=$PREVIOUS holds no step records (a first try's OUT, as it came back)"
fi
OUT=${OUT:-$REPO/runs/gpu_check}
[[ "$OUT" == /* ]] || OUT=$PWD/$OUT
[[ "${OUT%/}" != "${PREVIOUS%/}" ]] || die "OUT and PREVIOUS are one directory: the first try's records would be lost"
mkdir -p "$OUT" || die "cannot create OUT=$OUT"
rm -f "$OUT"/{build,install,smoke,train,bench,pipeline,summary}.{json,md} "$OUT"/horovod-*.whl
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || die "mktemp failed"
[[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$WORK"' EXIT
PREFIX=$WORK/prefix
mkdir -p "$PREFIX" "$WORK/logs"
CORES=$(nproc)
PY_TAG=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])') || die "'$PY' does not run"

if [[ "$MODE" == gpu ]]; then
    BUDGET_S=${BUDGET_S:-330}
    DEVICE=cuda
    BENCH=(--model resnet50 --image-size 224 --batch-size 256 --warmup-steps 10 --steps 25 --reps 3)
    # 1,024 JPEGs: writing the 4,096 of the first runs took most of the step's 47-70 s there.
    PIPE=(--image-size 224 --batch-size 128 --write-images 1024 --batches 32
          --workers "${LOADER_WORKERS:-$((CORES > 1 ? CORES - 1 : 1))}")
    TRAIN_ARGS=""  # the digits demo as configured: 12 epochs
else
    BUDGET_S=${BUDGET_S:-900}
    DEVICE=cpu
    BENCH=(--model resnet18 --image-size 32 --batch-size 8 --warmup-steps 2 --steps 3 --reps 2)
    PIPE=(--image-size 32 --batch-size 8 --write-images 96 --batches 12 --workers "${LOADER_WORKERS:-1}")
    TRAIN_ARGS="training.epochs=5"  # the digits pass 0.95 by epoch 4 (0.986 seen); 12 take minutes here
fi
# Every step: the carried prefix first, then the tree's own code, on the host's Python.
export PYTHONPATH=$PREFIX:$REPO${PYTHONPATH:+:$PYTHONPATH}
export PATH=$PREFIX/bin:$(dirname "$(command -v "$PY")"):$PATH
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PY MODE DEVICE WORK PREFIX CARRY REPO CORES SDIST_NAME PY_TAG OUT PREVIOUS
STARTED=$SECONDS
echo "gpu_check: MODE=$MODE HOROVOD_BUILD=$HOROVOD_BUILD PYTHON=$PY OUT=$OUT WORK=$WORK budget ${BUDGET_S}s, $CORES cores"

# run_step NAME CAP_SECONDS FUNCTION: the function under `timeout` (the whole process group is
# killed when it runs out), bounded by CAP and by what is left of BUDGET_S; then its record.
run_step() {
    local name=$1 cap=$2 fn=$3 left limit rc began cpu
    left=$((BUDGET_S - (SECONDS - STARTED)))
    limit=$((cap < left ? cap : left))
    # The second try: a step the first try passed is not run again; its record is carried over.
    # (build installs the first try's wheel instead, in step_build; install is 5 s: both run.)
    if [[ -n "$PREVIOUS" && " smoke train bench pipeline " == *" $name "* ]] \
        && "$PY" "$REPO/tools/gpu_check.py" passed "$PREVIOUS/$name.json"; then
        "$PY" "$REPO/tools/gpu_check.py" record "$name" --out "$OUT" --work "$WORK" --mode "$MODE" \
            --previous "$PREVIOUS/$name.json"
        return
    fi
    if [[ " ${SKIP_STEPS:-} " == *" $name "* ]]; then
        "$PY" "$REPO/tools/gpu_check.py" record "$name" --out "$OUT" --work "$WORK" --mode "$MODE" \
            --rc 124 --skipped "skipped (SKIP_STEPS)"
        return
    fi
    if ((limit < 15)); then
        "$PY" "$REPO/tools/gpu_check.py" record "$name" --out "$OUT" --work "$WORK" --mode "$MODE" \
            --rc 124 --skipped "no time left of BUDGET_S=$BUDGET_S"
        return
    fi
    echo "gpu_check: $name (at most ${limit}s)"
    began=$SECONDS
    times > "$WORK/times.before"  # not in $(...): a subshell has no children of its own
    timeout --kill-after=10 "$limit" bash -c "$fn" > "$WORK/logs/$name.log" 2>&1
    rc=$?
    times > "$WORK/times.after"
    cpu=$(($(children_cpu_seconds "$WORK/times.after") - $(children_cpu_seconds "$WORK/times.before")))
    "$PY" "$REPO/tools/gpu_check.py" record "$name" --out "$OUT" --work "$WORK" --mode "$MODE" \
        --rc "$rc" --seconds "$((SECONDS - began))" --cpu-seconds "$cpu" --log "$WORK/logs/$name.log"
}

# CPU seconds (user + system, whole seconds) of every child the shell had waited for, from what
# `times` wrote (its second line): a step's share over its wall seconds says how many cores it
# kept busy (the build's: what 16 cores buy).
children_cpu_seconds() {
    awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] } }
         END { printf "%d", s }' "$1"
}

# The carried wheels into PREFIX, before the build: Horovod's setup.py needs cffi to build.
install_carried() {
    shopt -s nullglob
    # The binary wheels carried are for one Python (--prepare's CARRY_PYTHON, the GPU host's
    # 3.12); on another (a CPU host with its own cffi) only the pure-Python ones apply.
    local wheels=("$CARRY"/*-none-any.whl "$CARRY"/*-"$PY_TAG"-*.whl)
    # Never --upgrade: pip --target then replaces whole top-level directories, bin/ included,
    # and cffi's script (cffi-gen-src) took horovodrun's place (the rehearsal, 2026-12-06).
    if ((${#wheels[@]})); then
        # -qq: a second call (step_install) warns of every directory already there.
        "$PY" -m pip install -qq --no-index --no-deps --no-compile --target "$PREFIX" "${wheels[@]}"
    fi
}

step_build() {
    set -eo pipefail
    install_carried
    if [[ "$HOROVOD_BUILD" == reuse ]]; then
        "$PY" "$REPO/tools/gpu_check.py" built --work "$WORK"
        return
    fi
    local wheel previous=()
    wheel=$(previous_wheel) && previous=(--previous "$PREVIOUS/build.json")
    if [[ -z "$wheel" ]]; then
        build_horovod || return 1
        wheel=$(tail -n 1 "$WORK/wheel.txt")
    fi
    # --upgrade: PREFIX/bin holds the carried wheels' scripts already; horovodrun must get in.
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$PREFIX" "$wheel"
    [[ -x "$PREFIX/bin/horovodrun" ]] || { echo "the wheel installed no $PREFIX/bin/horovodrun"; return 1; }
    # The wheel goes back with OUT (a second try then skips the build: PREVIOUS).
    "$PY" "$REPO/tools/gpu_check.py" built --work "$WORK" --wheel "$wheel" --out "$OUT" "${previous[@]}"
}

# The first try's wheel, when PREVIOUS holds one from a build that passed (else nothing).
previous_wheel() {
    [[ -n "$PREVIOUS" ]] || return 1
    "$PY" "$REPO/tools/gpu_check.py" passed "$PREVIOUS/build.json" || return 1
    compgen -G "$PREVIOUS/horovod-*.whl" | head -n 1
}

build_horovod() {
    local gpu=()
    [[ "$MODE" == gpu || "$HOROVOD_BUILD" == nccl ]] && gpu=(--gpu --cuda-cc-list "${CUDA_CC:-90}")
    # GCC 13 (the GPU host's Ubuntu 24.04) pulls fewer standard headers in through others, and
    # Horovod 0.28.1 leans on that (group_table.h uses std::string without <string>: seen on the
    # H200, 2026-12-04). CMake seeds its C++ flags from CXXFLAGS at configure time, so these
    # reach every C++ compile without patching Horovod's sources.
    local header
    # (GCC 13 porting notes name <string>, <system_error>, <cstdint>, <cstdio>, <cstdlib>.)
    for header in cstdint cstdio cstdlib string system_error stdexcept memory vector unordered_map; do
        CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }-include $header"
    done
    # No debug info in the linked libraries (CMake seeds its linker flags from LDFLAGS): the
    # wheel then fits what a device run brings back (16 MiB a file).
    LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,--strip-debug"
    export CXXFLAGS LDFLAGS
    if ! "$PY" "$REPO/tools/horovod_wheel.py" --torch-only "${gpu[@]}" --sdist "$CARRY/$SDIST_NAME" \
        --cache-dir "$WORK/hvd-cache" --print-wheel | tee "$WORK/wheel.txt"; then
        # The log's tail is pip's traceback; the compiler's own first errors say what broke.
        grep -h -E 'error:|Error [0-9]|No such file' "$WORK"/hvd-cache/logs/*.log | cut -c1-300 | head -n 18
        return 1
    fi
}

step_install() {
    set -e
    install_carried  # again, in case the build step ran out of time before it
    "$PY" "$REPO/tools/gpu_check.py" imports --out "$WORK/imports.json" --carried "$CARRY"
    cat "$WORK/imports.json"
}

step_smoke() {
    set -e
    # One launch for both (horovodrun's own start-up costs seconds; on a host with TensorFlow, a minute).
    horovodrun -np 1 -H localhost:1 --gloo bash -c '"$PY" -m hvdcls smoke --backend torch \
        --output-dir "$WORK/smoke" && "$PY" "$REPO/tools/gpu_check.py" probe --device "$DEVICE" \
        --out "$WORK/probe.json"'
}

step_train() {
    set -e
    cd "$WORK"
    "$PY" -m hvdcls train --backend torch --config "$REPO/configs/digits.yaml" --quiet \
        --output-dir "$WORK/train" "training.device=$DEVICE" $TRAIN_ARGS
}

step_bench() {
    set -e
    cd "$WORK"
    # shellcheck disable=SC2086 # BENCH_ARGS: flags without spaces, split on purpose
    "$PY" -m hvdcls bench --backends torch --np 1 --compression none --device "$DEVICE" $BENCH_ARGS \
        --quiet --output-dir "$WORK/bench"
}

step_pipeline() {
    set -e
    cd "$REPO/benchmarks"
    for loader in hvdcls torchvision; do
        # shellcheck disable=SC2086
        "$PY" input_pipeline.py --loader "$loader" --data-path "$WORK/jpegs" $PIPE_ARGS \
            --out "$WORK/pipeline-$loader.json"
    done
}
export BUDGET_S HOROVOD_BUILD CUDA_CC=${CUDA_CC:-90}
export -f install_carried step_build previous_wheel build_horovod step_install step_smoke step_train step_bench step_pipeline
export BENCH_ARGS="${BENCH[*]}" PIPE_ARGS="${PIPE[*]}" TRAIN_ARGS="${TRAIN_ARGS:-}"

# Caps per step (seconds), also bounded by what is left of BUDGET_S. On the GPU a hung step (an
# NCCL wait, say) must not eat the later steps' time; a loaded 2-core CPU host needs more.
# The GPU mode's caps are the plan's (header); the sum of the plan is what BUDGET_S allows.
if [[ "$MODE" == gpu ]]; then CAPS=(200 15 45 60 120 40); else CAPS=(400 120 180 300 300 200); fi
CAPS[0]=${BUILD_TIMEOUT_S:-${CAPS[0]}}  # a slow or loaded host's build may need more
run_step build "${CAPS[0]}" step_build
run_step install "${CAPS[1]}" step_install
run_step smoke "${CAPS[2]}" step_smoke
run_step train "${CAPS[3]}" step_train
run_step bench "${CAPS[4]}" step_bench
run_step pipeline "${CAPS[5]}" step_pipeline

# summary.md goes to stdout, not OUT: with the wheel, OUT holds the 8 files a device run returns.
"$PY" "$REPO/tools/gpu_check.py" summarize --out "$OUT" --mode "$MODE" --table "$WORK/summary.md"
rc=$?
echo "gpu_check: $((SECONDS - STARTED)) s in all; results in $OUT"
exit $rc
