"""Build (once) and install the Horovod 0.28.1 wheel that matches this environment.

Run with the virtual environment's Python, after torch and TensorFlow are installed:

    .venv/bin/python tools/horovod_wheel.py            # CPU hosts: Gloo + MPI
    .venv/bin/python tools/horovod_wheel.py --gpu      # GPU hosts: + NCCL (needs a GPU TensorFlow)
    .venv/bin/python tools/horovod_wheel.py --print-key
    .venv/bin/python tools/horovod_wheel.py --print-wheel   # path of the cached wheel
    python3 tools/horovod_wheel.py --torch-only --gpu --sdist horovod-0.28.1.tar.gz \
        --cuda-cc-list 90 --cache-dir /tmp/hvd --print-wheel   # a bare GPU host (tools/gpu_check.sh)

Horovod's last release does not build as shipped against current PyTorch: its torch
extension is pinned to C++14 while torch 2.14's headers demand C++20. We lift the standard
in our build step (tools/cxx_std_launcher.sh, given to CMake as CMAKE_CXX_COMPILER_LAUNCHER)
instead of forking Horovod. The wheel is cached outside the repository, keyed by everything
it was built against (Horovod, torch, TensorFlow, Python, MPI, CUDA, flags, this recipe), so a
second setup on the same machine installs it in seconds.

Standard library only: this runs before our own package is installed.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata, util
from pathlib import Path

HOROVOD_VERSION = "0.28.1"
TOOLS_DIR = Path(__file__).resolve().parent
LAUNCHER = TOOLS_DIR / "cxx_std_launcher.sh"
# Written into the venv after a successful install; a matching key means nothing to do.
STAMP_NAME = "hvdcls-horovod-build.json"
# torch's headers say which standard they need: `#error C++20 or later compatible compiler ...`
CXX_ERROR_RE = re.compile(r"#error C\+\+(\d+) or later compatible compiler")
RECIPE_VERSION = 1
FIXED_FLAGS = {
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITH_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITH_MPI": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
}
# --torch-only: PyTorch and Gloo alone, for hosts with neither TensorFlow nor MPI (a bare GPU host).
TORCH_ONLY_FLAGS = {
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
}
# Fields added after wheels were cached: left out of the key while empty (the defaults), so
# adding them rebuilt nobody's wheel.
OPTIONAL_KEY_FIELDS = ("frameworks", "cuda_cc_list")


class SetupError(Exception):
    """A problem the user can fix; printed as one line."""


@dataclass(frozen=True)
class BuildInputs:
    """Everything the Horovod binary depends on; its hash names the cached wheel."""

    horovod: str
    python: str
    platform: str
    torch: str
    tensorflow: str
    cxx_std: str
    mpi: str
    cuda_home: str
    gpu_operations: str
    nccl: str
    recipe: str
    frameworks: str = ""  # "" (torch + TensorFlow, Gloo + MPI) | "torch" (--torch-only)
    cuda_cc_list: str = ""  # HOROVOD_BUILD_CUDA_CC_LIST, e.g. "90"; "" = every arch nvcc knows

    def flags(self) -> dict[str, str]:
        return TORCH_ONLY_FLAGS if self.frameworks == "torch" else FIXED_FLAGS

    def key(self) -> str:
        fields = {name: value for name, value in asdict(self).items()
                  if value or name not in OPTIONAL_KEY_FIELDS}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
        variant = "nccl" if self.gpu_operations == "NCCL" else "cpu"
        frameworks = f"-tf{self.tensorflow}" if self.frameworks != "torch" else "-torchonly"
        return (f"horovod-{self.horovod}-{self.python}-{self.platform}-torch{self.torch}"
                f"{frameworks}-{variant}-{digest}").replace("+", "_")


def default_cache_dir() -> Path:
    base = os.environ.get("HVDCLS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hvdcls")
    return Path(base)


def distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def tensorflow_version() -> str:
    for dist in ("tensorflow-cpu", "tensorflow", "tf-nightly"):
        version = distribution_version(dist)
        if version:
            return version
    return ""


def package_dir(name: str) -> Path | None:
    """Where a package lives, found without importing it (importing torch costs seconds)."""
    spec = util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def required_cxx_standard(torch_dir: Path) -> str:
    """The C++ standard the installed torch headers insist on (17 when they do not say)."""
    header = torch_dir / "include" / "ATen" / "ATen.h"
    try:
        match = CXX_ERROR_RE.search(header.read_text(errors="replace"))
    except OSError:
        match = None
    return match.group(1) if match else "17"


def torch_cuda_version(torch_dir: Path) -> str:
    """torch.version.cuda, read from the file so torch is not imported."""
    text = (torch_dir / "version.py").read_text(errors="replace")
    match = re.search(r"^cuda(?:: \S+)? = '([^']+)'", text, re.MULTILINE)
    return match.group(1) if match else ""


def is_cuda_toolkit(path: str) -> bool:
    return bool(path) and Path(path, "include", "cuda_runtime.h").exists()


def cuda_toolkit_home() -> str:
    """The CUDA toolkit to build against when torch is a CUDA build.

    torch's cpp_extension takes `nvcc`'s grandparent directory, which is wrong when `nvcc` is
    a wrapper script (/usr/local/bin/nvcc gives /usr/local); we require the headers to be there.
    """
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda",
                  str(Path(nvcc).resolve().parent.parent) if nvcc else ""]
    found = next((c for c in candidates if is_cuda_toolkit(c)), "")
    if not found and nvcc:
        raise SetupError(f"torch is a CUDA build and {nvcc} exists, but no CUDA toolkit with "
                         "include/cuda_runtime.h was found: set CUDA_HOME to it")
    return found


def command_first_line(*cmd: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def recipe_digest(flags: dict[str, str] = FIXED_FLAGS) -> str:
    """Changing how we build must invalidate wheels built the old way.

    Covers the compiler launcher, the fixed build flags and RECIPE_VERSION (bump it when the
    build logic here changes); not this file's text, so editing a comment costs no rebuild.
    """
    digest = hashlib.sha256(LAUNCHER.read_bytes())
    digest.update(json.dumps([RECIPE_VERSION, flags], sort_keys=True).encode())
    return digest.hexdigest()[:12]


def collect_inputs(gpu: bool, torch_only: bool = False, cuda_cc_list: str = "") -> BuildInputs:
    torch_dir = package_dir("torch")
    torch = distribution_version("torch")
    if torch_dir is None or not torch:
        raise SetupError("torch is not installed in this environment: run `make setup` first")
    tensorflow = mpi = ""
    if not torch_only:  # --torch-only builds neither the TensorFlow part nor MPI
        tensorflow = tensorflow_version()
        if not tensorflow:
            raise SetupError("tensorflow is not installed in this environment: run `make setup` "
                             "first (or build with --torch-only)")
        mpi = command_first_line("mpirun", "--version")
        if not mpi:
            raise SetupError("mpirun not found: install OpenMPI (`apt-get install openmpi-bin "
                             "libopenmpi-dev`) or run `make setup`, which does it")
    flags = TORCH_ONLY_FLAGS if torch_only else FIXED_FLAGS
    cuda_home = cuda_toolkit_home() if torch_cuda_version(torch_dir) else ""
    return BuildInputs(
        horovod=HOROVOD_VERSION,
        python=f"cp{sys.version_info.major}{sys.version_info.minor}",
        platform=f"{platform.system().lower()}_{platform.machine()}",
        torch=torch,
        tensorflow=tensorflow,
        cxx_std=required_cxx_standard(torch_dir),
        mpi=mpi,
        cuda_home=cuda_home,
        gpu_operations="NCCL" if gpu else "",
        nccl=nccl_source() if gpu else "",
        recipe=recipe_digest(flags),
        frameworks="torch" if torch_only else "",
        cuda_cc_list=cuda_cc_list,
    )


def nccl_source() -> str:
    """Which NCCL a GPU build links: the user's HOROVOD_NCCL_HOME, else torch's wheel."""
    if os.environ.get("HOROVOD_NCCL_HOME"):
        return os.environ["HOROVOD_NCCL_HOME"]
    version = distribution_version("nvidia-nccl-cu13") or distribution_version("nvidia-nccl-cu12")
    return f"nvidia-nccl=={version}" if version else ""


def nccl_home(cache_dir: Path) -> Path:
    """An NCCL prefix Horovod's CMake accepts, made from the nvidia-nccl wheel torch brings.

    The wheel ships only `libnccl.so.2`; CMake's find_library looks for `libnccl.so`, so we
    lay out include/ and lib/ with links in our cache rather than touching site-packages.
    """
    if os.environ.get("HOROVOD_NCCL_HOME"):
        return Path(os.environ["HOROVOD_NCCL_HOME"])
    nvidia = package_dir("nvidia")
    source = next((p for p in (nvidia / "nccl", nvidia / "cu13", nvidia / "cu12")
                   if (p / "include" / "nccl.h").exists()), None) if nvidia else None
    if source is None:
        raise SetupError("GPU build needs NCCL: no nccl.h under the nvidia-nccl wheel; "
                         "install a CUDA build of torch or set HOROVOD_NCCL_HOME")
    home = cache_dir / "nccl" / nccl_source().replace("==", "-").replace("+", "_")
    (home / "lib").mkdir(parents=True, exist_ok=True)
    # Re-point the links every time: the venv they were made for may be gone.
    for link, target in ((home / "include", source / "include"),
                         (home / "lib" / "libnccl.so", source / "lib" / "libnccl.so.2")):
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)
    return home


def build_environment(inputs: BuildInputs, cache_dir: Path) -> dict[str, str]:
    # Horovod reads many HOROVOD_* variables at build time; one left in the user's shell
    # (HOROVOD_WITHOUT_PYTORCH, HOROVOD_GPU_OPERATIONS...) would change the build behind
    # the cache key's back, so only ours reach it.
    env = {name: value for name, value in os.environ.items() if not name.startswith("HOROVOD_")}
    env.update(inputs.flags())
    env.update({
        "CMAKE_CXX_COMPILER_LAUNCHER": str(LAUNCHER),
        "HVDCLS_CXX_STD": inputs.cxx_std,
        # Horovod's setup.py runs make -j8 unless MAKEFLAGS is set; match the machine instead.
        "MAKEFLAGS": f"-j{os.cpu_count() or 2}",
        # CMake 4 refuses cmake_minimum_required below 3.5, which Horovod's bundled Gloo and
        # flatbuffers still ask for (2.8.12); older CMakes ignore this variable.
        "CMAKE_POLICY_VERSION_MINIMUM": "3.5",
    })
    if inputs.cuda_home:
        # A CUDA build of torch makes Horovod's torch part look for the toolkit; without both
        # variables CMake reports `Could NOT find CUDAToolkit`.
        env["CUDA_HOME"] = env["HOROVOD_CUDA_HOME"] = inputs.cuda_home
    if inputs.gpu_operations:
        env["HOROVOD_GPU_OPERATIONS"] = inputs.gpu_operations
        env["HOROVOD_NCCL_HOME"] = str(nccl_home(cache_dir))
        env["HOROVOD_NCCL_LINK"] = "SHARED"
    if inputs.cuda_cc_list:  # nvcc builds Horovod's few kernels for these archs only (faster)
        env["HOROVOD_BUILD_CUDA_CC_LIST"] = inputs.cuda_cc_list
    return env


# --sdist: a Horovod sdist carried to a host without network (set by main()).
SDIST_OVERRIDE: Path | None = None


def fetch_sdist(cache_dir: Path) -> Path:
    if SDIST_OVERRIDE is not None:
        if not SDIST_OVERRIDE.is_file():
            raise SetupError(f"--sdist {SDIST_OVERRIDE}: no such file")
        return SDIST_OVERRIDE
    sdist_dir = cache_dir / "sdist"
    found = sorted(sdist_dir.glob(f"horovod-{HOROVOD_VERSION}.tar.gz"))
    if found:
        return found[0]
    sdist_dir.mkdir(parents=True, exist_ok=True)
    run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                f"horovod=={HOROVOD_VERSION}", "-d", str(sdist_dir)],
               cache_dir / "logs" / "sdist-download.log", os.environ.copy())
    return next(sdist_dir.glob(f"horovod-{HOROVOD_VERSION}.tar.gz"))


def run_logged(cmd: list[str], log: Path, env: dict[str, str]) -> None:
    """Run a long command with its output in a log; on failure, show the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        result = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        raise SetupError(f"`{' '.join(cmd[:4])} ...` failed (exit {result.returncode}); full log: {log}")


def build_wheel(inputs: BuildInputs, cache_dir: Path, target: Path) -> Path:
    sdist = fetch_sdist(cache_dir)
    log = cache_dir / "logs" / f"{inputs.key()}.log"
    frameworks = "no TensorFlow" if inputs.frameworks == "torch" else f"TensorFlow {inputs.tensorflow}"
    nccl = ", NCCL" if inputs.gpu_operations else ""
    print(f"[setup] building Horovod {inputs.horovod} against torch {inputs.torch}, {frameworks}, "
          f"C++{inputs.cxx_std}{nccl} "
          f"(several minutes; log: {log})", flush=True)
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
    scratch.chmod(0o755)  # the cache may be shared by several users of one machine
    try:
        run_logged([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                    "--no-cache-dir", "-w", str(scratch), str(sdist)],
                   log, build_environment(inputs, cache_dir))
        built = next(scratch.glob("horovod-*.whl"))
        info = {"inputs": asdict(inputs), "key": inputs.key(), "wheel": built.name,
                "build_seconds": round(time.monotonic() - started, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (scratch / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
        # Rename the finished directory into place so a killed build never looks cached.
        os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"[setup] Horovod wheel built in {info['build_seconds']} s, cached in {target}", flush=True)
    return next(target.glob("horovod-*.whl"))


def cached_wheel(cache_dir: Path, inputs: BuildInputs, rebuild: bool) -> Path:
    wheels = cache_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    target = wheels / inputs.key()
    # One build at a time per cache: a second `make setup` waits instead of racing.
    with (wheels / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(target.glob("horovod-*.whl"))
        if found and not rebuild:
            print(f"[setup] reusing cached Horovod wheel {target.name}", flush=True)
            return found[0]
        shutil.rmtree(target, ignore_errors=True)  # stale or unwanted: make room for the new one
        return build_wheel(inputs, cache_dir, target)


def venv_stamp() -> Path:
    return Path(sys.prefix) / STAMP_NAME


def installed_key() -> str:
    try:
        return json.loads(venv_stamp().read_text()).get("key", "")
    except (OSError, ValueError):
        return ""


def install_wheel(wheel: Path) -> None:
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    # Replace whatever Horovod is there, without touching the frameworks...
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], check=True)
    # ...then add the runtime dependencies horovodrun needs (psutil, cloudpickle, pyyaml).
    subprocess.run([*pip, str(wheel)], check=True)
    info = json.loads((wheel.parent / "build-info.json").read_text())
    venv_stamp().write_text(json.dumps(info, indent=2) + "\n")


def ensure(inputs: BuildInputs, cache_dir: Path, rebuild: bool) -> None:
    key = inputs.key()
    if not rebuild and installed_key() == key and distribution_version("horovod") == HOROVOD_VERSION:
        print(f"[setup] Horovod {HOROVOD_VERSION} already installed ({key})", flush=True)
        return
    wheel = cached_wheel(cache_dir, inputs, rebuild)
    install_wheel(wheel)
    print(f"[setup] installed {wheel.name} ({key})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="build with NCCL for GPU hosts")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--rebuild", action="store_true", help="ignore the cached wheel")
    parser.add_argument("--print-key", action="store_true", help="print the cache key and exit")
    parser.add_argument("--print-wheel", action="store_true",
                        help="print the cached wheel's path (building it if missing), install nothing")
    parser.add_argument("--torch-only", action="store_true",
                        help="PyTorch + Gloo only: no TensorFlow part, no MPI (a bare GPU host)")
    parser.add_argument("--sdist", type=Path, help="build this Horovod sdist (no download)")
    parser.add_argument("--nccl-home", type=Path,
                        help="NCCL prefix (include/, lib/) for --gpu; default: torch's nvidia-nccl wheel")
    parser.add_argument("--cuda-cc-list", default="", metavar="CC[,CC]",
                        help="compute capabilities for Horovod's CUDA kernels, e.g. 90 (H100/H200); "
                             "default: every one nvcc supports (slower)")
    args = parser.parse_args(argv)
    global SDIST_OVERRIDE
    SDIST_OVERRIDE = args.sdist.resolve() if args.sdist else None
    if args.nccl_home:  # read where HOROVOD_NCCL_HOME is (nccl_source, nccl_home)
        os.environ["HOROVOD_NCCL_HOME"] = str(args.nccl_home.resolve())
    try:
        if args.cuda_cc_list and not re.fullmatch(r"\d+(,\d+)*", args.cuda_cc_list):
            raise SetupError(f"--cuda-cc-list {args.cuda_cc_list!r}: expected numbers like 90 or 80,90")
        inputs = collect_inputs(args.gpu, args.torch_only, args.cuda_cc_list)
        if args.print_key:
            print(inputs.key())
            return 0
        if args.print_wheel:  # `make wheelhouse` copies it into the Docker build context
            print(cached_wheel(args.cache_dir, inputs, args.rebuild))
            return 0
        ensure(inputs, args.cache_dir, args.rebuild)
    except SetupError as err:
        print(f"[setup] error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
