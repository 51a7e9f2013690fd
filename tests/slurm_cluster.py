"""A private one-node Slurm for tests: munged, slurmctld and slurmd with every file (key,
sockets, pid files, state, logs, slurm.conf) under one temporary directory and ports of their
own, so nothing global is changed and several can coexist. Debian's `slurm-wlm` and `munge`
must be installed (tools/setup.sh does it); without them the test fails, naming the packages.

    with SlurmCluster(cpus=2) as cluster:
        env = cluster.env()           # SLURM_CONF for sbatch/squeue/scontrol and the service
"""
from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")

SLURM_CONF = """\
ClusterName=hvdclstest
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
# Refuse at submit what the partition can never run (more nodes than it has), rather than queue it.
EnforcePartLimits=ALL
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
MinJobAge=600
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def missing_tools() -> list[str]:
    return [tool for tool in DAEMONS if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    def __init__(self, cpus: int = 2):
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self.processes: list[subprocess.Popen] = []
        self.conf = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> "SlurmCluster":
        missing = missing_tools()
        assert not missing, f"Slurm tests need Debian's slurm-wlm and munge (`make setup`); missing {missing}"
        assert os.geteuid() == 0, "a private Slurm needs root (slurmd starts jobs as their user)"
        # World-traversable (munged, as the munge user, reaches its socket here), private files inside.
        self.root = Path(tempfile.mkdtemp(prefix="hvdcls-slurm-"))
        self.root.chmod(0o755)
        try:
            self.start_munge()
            self.start_slurm()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start_munge(self) -> None:
        munge_dir = self.root / "munge"
        munge_dir.mkdir()
        munge_dir.chmod(0o755)  # munged: its socket's directory must be reachable by all
        key = munge_dir / "munge.key"
        key.write_bytes(secrets.token_bytes(128))  # a fresh key per cluster, never a shared one
        key.chmod(0o400)
        user = pwd.getpwnam("munge")
        for path in (munge_dir, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        self.munge_socket = munge_dir / "munge.socket"
        self.spawn(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                    "munged", "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
                    f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={munge_dir / 'munged.log'}",
                    f"--seed-file={munge_dir / 'munged.seed'}"], self.root / "munged.out")
        self.wait_for(lambda: self.munge_socket.exists(), "munged's socket", self.root / "munged.out")

    def start_slurm(self) -> None:
        for sub in ("ctld", "spool"):
            (self.root / sub).mkdir()
        self.conf = self.root / "slurm.conf"
        self.conf.write_text(SLURM_CONF.format(host=self.host, ctld_port=free_port(), d_port=free_port(),
                                               munge_socket=self.munge_socket, root=self.root, cpus=self.cpus))
        self.spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], self.root / "slurmctld.out")
        self.spawn(["slurmd", "-D", "-f", str(self.conf)], self.root / "slurmd.out")
        self.wait_for(self.node_idle, "the node to be idle", self.root / "slurmctld.log")

    def node_idle(self) -> bool:
        found = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env(), capture_output=True, text=True)
        return found.returncode == 0 and found.stdout.strip().startswith("idle")

    def jobs_listed(self) -> list[str]:
        found = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env(), capture_output=True, text=True)
        return found.stdout.split() if found.returncode == 0 else []

    def spawn(self, command: list[str], log: Path) -> None:
        with open(log, "ab") as out:
            self.processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True))

    def wait_for(self, ready, what: str, log: Path, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while not ready():
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            text = log.read_text()[-2000:] if log.exists() else ""
            assert not dead and time.time() < deadline, f"waiting for {what}: {dead or 'timeout'}\n{text}"
            time.sleep(0.2)

    def __exit__(self, *_exc) -> None:
        """Every job cancelled, every daemon ended, the directory removed."""
        if self.processes and getattr(self, "conf", None) is not None:
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env(), capture_output=True, timeout=30)
            deadline = time.time() + 20
            while self.jobs_listed() and time.time() < deadline:
                time.sleep(0.5)
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)
