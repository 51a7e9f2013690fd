#!/usr/bin/env bash
# One-command, idempotent set-up: `make setup` (CPU hosts) or `make setup GPU=1` (GPU hosts).
#
#   1. OpenMPI, a C++ compiler, CMake, ssh, Slurm and munge, Prometheus, Chromium and its
#      chromedriver (for the tests) from Debian's packages, installed when missing;
#   2. a virtual environment (.venv) with torch + torchvision, TensorFlow (Keras 3), mpi4py
#      built against that OpenMPI, the service's extra (hvdcls[serve]: FastAPI, uvicorn,
#      SQLAlchemy, pydantic, httpx), MLflow's client (hvdcls[track]), Optuna and Hydra's override
#      parser (hvdcls[sweep]), simplejpeg (hvdcls[fast-jpeg]), the test tools (with an MLflow
#      server), and this package (editable);
#   3. Horovod 0.28.1 built for this exact environment by tools/horovod_wheel.py, cached
#      under ~/.cache/hvdcls/wheels and reused on the next run.
#
# Each step records what it installed (a stamp keyed by the requirement files), so a second
# run does nothing and takes seconds. Environment: VENV, PYTHON, GPU=1, HVDCLS_CACHE.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
GPU="${GPU:-0}"
started=$(date +%s)

say() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 2; }

system_packages_missing() {
    local missing=()
    command -v mpirun >/dev/null || missing+=(openmpi-bin)
    command -v mpicxx >/dev/null || missing+=(libopenmpi-dev)
    command -v g++ >/dev/null || missing+=(g++)
    command -v cmake >/dev/null || missing+=(cmake)
    command -v make >/dev/null || missing+=(make)
    # horovodrun reaches other hosts (and checks local ones) through ssh.
    command -v ssh >/dev/null || missing+=(openssh-client)
    # `hvdcls bench --link-mbit` runs an sshd in each of its network namespaces.
    [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    # tests/parallel/test_slurm.py starts a private one-node Slurm (`hvdcls serve --executor slurm`).
    command -v sbatch >/dev/null || missing+=(slurm-wlm)
    [ -x /usr/sbin/munged ] || missing+=(munge)
    # Training processes preload tcmalloc (hvdcls/allocator.py; glibc's malloc without it).
    compgen -G "/usr/lib/*/libtcmalloc_minimal.so.4" >/dev/null || missing+=(libtcmalloc-minimal4)
    # tests/parallel/test_serve.py has a private Prometheus scrape the service and a job.
    command -v prometheus >/dev/null || missing+=(prometheus)
    # tests/parallel/test_serve_console.py drives the web console in a headless Chromium (Selenium,
    # requirements/test.txt, through Debian's chromedriver); a font, or its screenshots show boxes.
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
    [ -d /usr/share/fonts/truetype/dejavu ] || missing+=(fonts-dejavu-core)
    echo "${missing[@]:-}"
}

install_system_packages() {
    local missing
    missing=$(system_packages_missing)
    [ -z "$missing" ] && return 0
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo -n true 2>/dev/null || die "missing system packages ($missing) and no root: run \`sudo apt-get install $missing\`, then \`make setup\` again"
        sudo="sudo -n"
    fi
    command -v apt-get >/dev/null || die "missing system packages ($missing) and no apt-get: install OpenMPI, g++ and CMake with your package manager"
    say "installing Debian packages as root: $missing"
    $sudo apt-get update -qq || die "apt-get update failed: check the package mirror"
    # shellcheck disable=SC2086  # word splitting of the package list is intended
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null \
        || die "apt-get install $missing failed"
}

ensure_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        command -v "$PYTHON" >/dev/null || die "$PYTHON not found: install Python 3.11"
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
            || die "Python 3.11 is required (torch 2.14.1 + tensorflow-cpu 2.18.1 + Horovod 0.28.1); found $("$PYTHON" --version 2>&1). Set PYTHON=python3.11"
        say "creating $VENV"
        "$PYTHON" -m venv "$VENV" || die "\`$PYTHON -m venv\` failed: install the venv module (Debian: python3-venv)"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
    fi
    "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
        || die "$VENV was made with another Python than 3.11: \`make distclean\`, then \`make setup\`"
}

requirement_files() {
    local tf=requirements/tensorflow.txt
    [ "$GPU" = 1 ] && tf=requirements/tensorflow-gpu.txt
    echo requirements/core.txt requirements/serve.txt requirements/track.txt requirements/sweep.txt \
        requirements/models.txt requirements/fast-jpeg.txt requirements/torch.txt "$tf" requirements/test.txt
}

# hydra-core goes in without its dependencies (requirements/sweep-space.txt says why): pip's resolver
# would refuse it beside our omegaconf pin.
NO_DEPS=requirements/sweep-space.txt

ensure_python_packages() {
    local files stamp
    files=$(requirement_files)
    # shellcheck disable=SC2086
    stamp="$VENV/.hvdcls-deps-$(cat $files $NO_DEPS setup.py | sha256sum | cut -c1-16)"
    if [ -f "$stamp" ]; then
        say "Python packages up to date"
        return 0
    fi
    say "installing Python packages ($files)"
    # tensorflow and tensorflow-cpu install the same module: switching GPU=1 on or off must
    # remove the other one, or the two overwrite each other's files.
    local other=tensorflow
    [ "$GPU" = 1 ] && other=tensorflow-cpu
    if "$VENV/bin/python" -m pip show --quiet "$other" >/dev/null 2>&1; then
        "$VENV/bin/python" -m pip uninstall --quiet --yes "$other"
    fi
    local args=()
    for f in $files; do args+=(-r "$f"); done
    # --no-compile, then compileall on every core: pip byte-compiles the ~22,000 modules one at
    # a time (61 s of one core here); the .pyc files are the same.
    "$VENV/bin/python" -m pip install --quiet --no-compile "${args[@]}" || die "pip install failed (see above)"
    "$VENV/bin/python" -m pip install --quiet --no-compile --no-deps -r "$NO_DEPS" || die "pip install -r $NO_DEPS failed (see above)"
    # Built from source against the system OpenMPI: PyPI's binary wheels bundle another MPI.
    "$VENV/bin/python" -m pip install --quiet --no-binary mpi4py "mpi4py>=4" || die "mpi4py failed to build against OpenMPI"
    "$VENV/bin/python" -m pip install --quiet --no-deps -e . || die "installing hvdcls failed"
    # Its status is 1 when a file does not compile (a few packages ship such files as data),
    # which pip's own compile passes over too.
    "$VENV/bin/python" -m compileall -qq -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
    rm -f "$VENV"/.hvdcls-deps-*
    touch "$stamp"
}

ensure_horovod() {
    local flags=()
    [ "$GPU" = 1 ] && flags+=(--gpu)
    "$VENV/bin/python" tools/horovod_wheel.py "${flags[@]}"
}

install_system_packages
ensure_venv
ensure_python_packages
ensure_horovod
say "done in $(( $(date +%s) - started )) s ($VENV ready; \`$VENV/bin/hvdcls doctor\` checks it)"
