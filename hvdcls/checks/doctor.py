"""`hvdcls doctor`: can this installation train with both backends under both launchers?

Reports versions, what `horovodrun --check-build` says, which Horovod build is installed
(CPU: Gloo + MPI, or GPU: + NCCL) and whether a Docker engine answers. Exits 0 when PyTorch
and TensorFlow, the Gloo and MPI controllers and `mpirun` are all usable, else 2 with what is
missing and how to fix it. `--smoke` also launches the real smoke job (2 ranks) under
`horovodrun --gloo` and `mpirun` for each backend.

Framework-free: everything is learned from package metadata and subprocesses, so a broken
framework install cannot crash the doctor that is meant to diagnose it.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path

from hvdcls import registry
from hvdcls.launching import launch

FIX_SETUP = "run `make setup` in the hvdcls checkout"
BUILD_STAMP = "hvdcls-horovod-build.json"  # written by tools/horovod_wheel.py
CHECK_LINE_RE = re.compile(r"^\s*\[(X| )\]\s+(.+?)\s*$")
SECTIONS = {"Available Frameworks:": "frameworks", "Available Controllers:": "controllers",
            "Available Tensor Operations:": "tensor_operations"}


@dataclass
class Report:
    versions: dict[str, str] = field(default_factory=dict)
    check_build: dict[str, dict[str, bool]] = field(default_factory=dict)
    build: dict = field(default_factory=dict)
    docker: str = ""
    smoke: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_quietly(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def dist_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


def mpi_version() -> str:
    result = run_quietly(["mpirun", "--version"], timeout=30)
    if result is None or result.returncode != 0:
        return ""
    return next((line.strip() for line in result.stdout.splitlines() if line.strip()), "")


def collect_versions() -> dict[str, str]:
    return {
        "python": sys.version.split()[0],
        "torch": dist_version("torch"),
        "torchvision": dist_version("torchvision"),
        "tensorflow": dist_version("tensorflow-cpu", "tensorflow"),
        "keras": dist_version("keras"),
        "horovod": dist_version("horovod"),
        "mpi4py": dist_version("mpi4py"),
        "mpi": mpi_version(),
    }


def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """`horovodrun --check-build` output -> {"frameworks": {"PyTorch": True, ...}, ...}."""
    parsed: dict[str, dict[str, bool]] = {}
    section = None
    for line in text.splitlines():
        if line.strip() in SECTIONS:
            section = SECTIONS[line.strip()]
            parsed[section] = {}
            continue
        match = CHECK_LINE_RE.match(line)
        if section and match:
            parsed[section][match.group(2)] = match.group(1) == "X"
    return parsed


def build_variant(check_build: dict[str, dict[str, bool]]) -> str:
    ops = check_build.get("tensor_operations", {})
    if ops.get("NCCL"):
        return "GPU (NCCL for GPU tensors; Gloo + MPI for CPU tensors)"
    return "CPU (Gloo + MPI)"


def read_build_stamp() -> dict:
    try:
        return json.loads(Path(sys.prefix, BUILD_STAMP).read_text())
    except (OSError, ValueError):
        return {}


def docker_engine() -> str:
    """The engine's version when one answers, else why not."""
    if shutil.which("docker") is None:
        return "no docker client"
    result = run_quietly(["docker", "version", "--format", "{{.Server.Version}}"], timeout=15)
    if result is not None and result.returncode == 0 and result.stdout.strip():
        return f"engine {result.stdout.strip()} answers"
    return "no engine answers (start dockerd; needed only for the Docker images)"


def horovod_check_build() -> tuple[dict, str]:
    """Horovod's own report, parsed; or why it could not be had (its last error line)."""
    result = run_quietly([launch.venv_tool("horovodrun"), "--check-build"])
    if result is None:
        return {}, "horovodrun did not run"
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        return {}, lines[-1] if lines else f"exit {result.returncode}"
    return parse_check_build(result.stdout), ""


def framework_problems(versions: dict[str, str], check_build: dict) -> list[str]:
    problems = []
    frameworks = check_build.get("frameworks", {})
    for label, dist, extra in (("PyTorch", "torch", "torch"), ("TensorFlow", "tensorflow", "tensorflow")):
        if not versions[dist]:
            problems.append(f"{label} is not installed: {FIX_SETUP} (or pip install 'hvdcls[{extra}]')")
        elif check_build and not frameworks.get(label):
            problems.append(f"Horovod's {label} extension does not load (built against another "
                            f"{label}?): {FIX_SETUP}, which rebuilds the wheel for this one")
    return problems


def horovod_problems(versions: dict[str, str], check_build: dict, failure: str = "") -> list[str]:
    if not versions["horovod"]:
        return [f"Horovod is not installed: {FIX_SETUP} (it builds 0.28.1 for this torch and TensorFlow)"]
    if not check_build:
        return [f"`horovodrun --check-build` failed ({failure or 'no output'}): {FIX_SETUP}"]
    problems = []
    for section, name in (("controllers", "Gloo"), ("controllers", "MPI"),
                          ("tensor_operations", "Gloo"), ("tensor_operations", "MPI")):
        if not check_build.get(section, {}).get(name):
            label = section.replace("_", " ")[:-1]
            problems.append(f"Horovod was built without the {name} {label}: "
                            f"install OpenMPI (libopenmpi-dev), then {FIX_SETUP}")
    return problems


def horovod_built_against() -> dict[str, str]:
    """Framework versions Horovod recorded in its own metadata.json when it was compiled.

    Read from the file, not by importing horovod: works for any Horovod install, ours or not.
    """
    spec = util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        recorded = json.loads(Path(list(spec.submodule_search_locations)[0], "metadata.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"torch": recorded.get("pytorch", ""), "tensorflow": recorded.get("tensorflow", "")}


def public_version(version: str) -> str:
    return version.split("+")[0]  # "2.14.1+cu130" and "2.14.1" are the same release


def build_mismatch_problems(built: dict[str, str], versions: dict[str, str], check_build: dict) -> list[str]:
    """The wheel must match the frameworks installed now (an upgrade breaks its extensions)."""
    problems = []
    for dist in ("torch", "tensorflow"):
        compiled, installed = public_version(built.get(dist, "")), public_version(versions[dist])
        if compiled and installed and compiled != installed:
            problems.append(f"Horovod was built against {dist} {compiled} but {installed} is installed: "
                            f"{FIX_SETUP} to rebuild")
    if check_build.get("tensor_operations", {}).get("NCCL") and dist_version("tensorflow-cpu"):
        problems.append("Horovod was built with NCCL but tensorflow-cpu is installed: its TensorFlow "
                        "op will not load beside it; `make setup GPU=1` installs a GPU TensorFlow")
    return problems


def mpi_problems(versions: dict[str, str]) -> list[str]:
    problems = []
    if not versions["mpi"]:
        problems.append("mpirun not found: `apt-get install openmpi-bin libopenmpi-dev`, then "
                        f"{FIX_SETUP}")
    if util.find_spec("mpi4py") is None:
        problems.append(f"mpi4py is not installed: {FIX_SETUP}")
    return problems


def run_smoke(backend: str, launcher: str) -> bool:
    """Launch the real 2-rank smoke job; True when every check passed on every rank."""
    from hvdcls.checks.smoke import launch_locally  # numpy: imported only when asked for

    with tempfile.TemporaryDirectory(prefix="hvdcls-doctor-") as report_dir:
        return launch_locally(backend, launcher, 2, Path(report_dir)).passed


def examine(with_smoke: bool) -> Report:
    report = Report(versions=collect_versions(), build=read_build_stamp(), docker=docker_engine())
    report.check_build, failure = horovod_check_build() if report.versions["horovod"] else ({}, "")
    report.problems = (framework_problems(report.versions, report.check_build)
                       + horovod_problems(report.versions, report.check_build, failure)
                       + build_mismatch_problems(horovod_built_against(), report.versions,
                                                 report.check_build)
                       + mpi_problems(report.versions))
    if with_smoke and report.ok:
        for backend in registry.names():
            for launcher in launch.LAUNCHERS:
                passed = run_smoke(backend, launcher)
                report.smoke[f"{backend} under {launcher}"] = passed
                if not passed:
                    report.problems.append(f"the 2-rank smoke job failed for {backend} under {launcher}: "
                                           "run it by hand to see why (docs/troubleshooting.md, "
                                           "'Checking an install')")
    return report


def render(report: Report) -> str:
    width = 17
    lines = [f"{name:<{width}} {value or 'missing'}" for name, value in report.versions.items()]
    variant = build_variant(report.check_build) if report.check_build else "unknown"
    key = f" [{report.build['key']}]" if report.build.get("key") else ""
    lines.append(f"{'horovod build':<{width}} {variant}{key}")
    for section, flags in report.check_build.items():
        marks = ", ".join(f"{name} {'yes' if on else 'no'}" for name, on in flags.items())
        lines.append(f"{section.replace('_', ' '):<{width}} {marks}")
    lines.append(f"{'docker':<{width}} {report.docker}")
    for name, passed in report.smoke.items():
        lines.append(f"{'smoke':<{width}} {name}: {'passed' if passed else 'FAILED'}")
    if report.ok:
        lines.append("OK: ready to train with torch and tensorflow under horovodrun --gloo and mpirun")
    else:
        lines += [f"PROBLEM: {problem}" for problem in report.problems]
    return "\n".join(lines)


def main(with_smoke: bool = False, as_json: bool = False) -> int:
    report = examine(with_smoke)
    if as_json:
        payload = dict(vars(report), ok=report.ok, variant=build_variant(report.check_build))
        print(json.dumps(payload, indent=2, sort_keys=True))
    else:
        print(render(report))
    return 0 if report.ok else 2
