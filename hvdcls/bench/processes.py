"""The bench's launches and the facts its reports start with: each launch in a process group of
its own, killed whole (the launcher's ranks too) on a timeout or an interruption, SIGTERM
unwinding as Ctrl-C does; the machine (CPU, cores, Python, the frameworks' versions).
Shared by `hvdcls bench` (hvdcls.bench.matrix), its to-accuracy mode and the tools beside it."""
from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
from importlib import metadata
from pathlib import Path


def kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def launch_group(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own, killed whole (the launcher's ranks too) on
    a timeout, which becomes exit 124, or when the bench itself is interrupted."""
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            out, err = process.communicate()
            return subprocess.CompletedProcess(cmd, 124, out, err + f"\ntimed out after {timeout:g} s")
        except BaseException:
            kill_group(process)
            raise
    return subprocess.CompletedProcess(cmd, process.returncode, out, err)


@contextlib.contextmanager
def terminate_unwinds():
    """SIGTERM (`kill`, a batch scheduler) unwinds like Ctrl-C does: the running launch is
    killed and the shaped-link namespaces are removed, instead of being left behind."""
    def unwind(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def machine() -> dict:
    cpu = ""
    if Path("/proc/cpuinfo").exists():
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                   platform.processor())
    versions = {}
    for name in ("torch", "torchvision", "tensorflow-cpu", "tensorflow", "keras", "horovod", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {"hostname": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "python": platform.python_version(), "platform": platform.platform(), "versions": versions}
