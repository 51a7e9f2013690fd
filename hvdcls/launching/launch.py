"""Command lines for Horovod's launchers: `horovodrun` (Gloo or MPI) and plain `mpirun`.

Framework-free. Used by `hvdcls demo`, `hvdcls doctor --smoke` and the parallel tests, so
that what we test is exactly what we tell users to type.
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

# Environment every rank needs under mpirun (horovodrun forwards the whole environment).
MPI_FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS",
                     "TF_CPP_MIN_LOG_LEVEL", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME")


def venv_tool(name: str) -> str:
    """A console script installed beside the running interpreter, else the one on PATH."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def horovodrun_tool() -> str:
    """hvdcls-horovodrun (Horovod's launcher without its per-launch build probe: 3 s less per
    job, hvdcls/launching/horovodrun.py) where hvdcls is installed with its scripts, else horovodrun."""
    ours = venv_tool("hvdcls-horovodrun")
    return ours if Path(ours).is_absolute() else venv_tool("horovodrun")


def hosts_arg(hosts: dict[str, int]) -> str:
    """{'host1': 4, 'host2': 4} -> 'host1:4,host2:4' (the -H syntax of both launchers)."""
    return ",".join(f"{host}:{slots}" for host, slots in hosts.items())


def horovodrun(np: int, command: list[str], hosts: dict[str, int] | None = None,
               controller: str = "gloo") -> list[str]:
    """`horovodrun -np N -H h:s,... --gloo|--mpi COMMAND`."""
    hosts = hosts or {"localhost": np}
    return [horovodrun_tool(), "-np", str(np), "-H", hosts_arg(hosts),
            f"--{controller}", *command]


# Horovod blacklists the host of a failed worker for good unless told otherwise; on one machine
# that is the only host, and the job would wait out --elastic-timeout. A cooldown lets it back.
BLACKLIST_COOLDOWN_SECONDS = (2, 5)


def horovodrun_elastic(np: int, min_np: int, max_np: int, discovery_script: str,
                       command: list[str], elastic_timeout: int = 60,
                       cooldown: tuple[int, int] | None = BLACKLIST_COOLDOWN_SECONDS,
                       network_interface: str | None = None) -> list[str]:
    """`horovodrun` in elastic mode: hosts come from `discovery_script` (prints host:slots
    lines), the job runs while at least `min_np` workers are left and ends with an error when
    fewer than `min_np` slots stay available for `elastic_timeout` seconds. Name the network
    interface when the job may start on one host: Horovod otherwise waits for a second one
    to agree on an interface with."""
    cmd = [horovodrun_tool(), "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
           "--host-discovery-script", discovery_script, "--elastic-timeout", str(elastic_timeout),
           "--gloo"]
    if cooldown:
        cmd += ["--blacklist-cooldown-range", str(cooldown[0]), str(cooldown[1])]
    if network_interface:
        cmd += ["--network-interface", network_interface]
    return cmd + command


def mpirun(np: int, command: list[str], hosts: dict[str, int] | None = None,
           env: dict[str, str] | None = None, extra_env: tuple[str, ...] = ()) -> list[str]:
    """The OpenMPI command line Horovod's documentation recommends.

    `-bind-to none -map-by slot` lets each rank use its own threads; `-mca pml ob1 -mca btl
    ^openib` avoids the InfiniBand transport that hangs on hosts without it. Variables named
    in MPI_FORWARDED_ENV (and `extra_env`) that are set in `env` are passed on with `-x`.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    hosts = hosts or {"localhost": np}
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(np), "-H", hosts_arg(hosts),
           "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")  # containers and CI run as root
    for name in (*MPI_FORWARDED_ENV, *extra_env):
        if name in environ:
            cmd += ["-x", name]
    return cmd + command


LAUNCHERS = ("horovodrun", "mpirun")


def local_job(launcher: str, np: int, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """Command line and environment for `np` ranks of `command` on this machine."""
    env = single_host_env()
    if launcher == "horovodrun":
        return horovodrun(np, command), env
    if launcher == "mpirun":
        return mpirun(np, command, env=env), env
    raise ValueError(f"unknown launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")


def hvdcls_command(*args: str) -> list[str]:
    """Run our CLI with the same interpreter, so every rank sees the same environment."""
    return [sys.executable, "-m", "hvdcls", *args]


def single_host_env(threads_per_rank: int = 1) -> dict[str, str]:
    """Environment for several ranks sharing one machine: one compute thread each.

    Without this every rank starts a thread per core and they fight over the CPUs.
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env
