"""Two "hosts" with a real, shaped link between them, on one machine.

    with ShapedHosts(Link(rate_mbit=1000, delay_ms=0.5)) as hosts:
        subprocess.run(hosts.horovodrun(2, [sys.executable, "-m", "hvdcls.bench.worker", ...]))

Each host is a network namespace holding one end of a veth pair (renamed hvd0 on both sides, so
`--network-interface hvd0` names it everywhere) and its own sshd on a private address; both ends
are shaped with tc (tbf for the rate, netem for the delay). horovodrun runs inside the first
namespace, so every byte between ranks crosses the shaped link and nothing leaves the
namespaces this made. Everything is removed on exit, also when the job failed. Needs root,
iproute2 (ip, tc) and OpenSSH's sshd.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hvdcls.bench import guard
from hvdcls.errors import UserError

SUBNET = "10.231.0"
INTERFACE = "hvd0"
SSH_PORT = 2222


@dataclass(frozen=True)
class Link:
    rate_mbit: float
    delay_ms: float = 0.0

    def describe(self) -> str:
        rate = f"{self.rate_mbit / 1000:g} Gbit/s" if self.rate_mbit >= 1000 else f"{self.rate_mbit:g} Mbit/s"
        return rate + (f", {self.delay_ms:g} ms delay" if self.delay_ms else "")


def unavailable_reason() -> Optional[str]:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc", "ssh", "ssh-keygen") if not shutil.which(tool)]
    if not Path("/usr/sbin/sshd").exists():
        missing.append("sshd (Debian: openssh-server)")
    if missing:
        return f"missing {', '.join(missing)}"
    probe = f"hvdcls-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def bucket_bytes(link: Link) -> int:
    """tbf's bucket: at least one timer tick of traffic; 10 ms of the rate is ample. A message
    smaller than it can pass at the veth's own speed when the bucket is full, so only a longer
    transfer is held to the rate: S bytes take at least (S - bucket) / rate."""
    return max(32_000, int(link.rate_mbit * 1e6 / 8 / 100))


def tc_commands(namespace: str, link: Link) -> list[list[str]]:
    """Shape one end: netem for the delay (if any), tbf below it for the rate."""
    tc = ["ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", INTERFACE]
    tbf = ["tbf", "rate", f"{link.rate_mbit:g}mbit", "burst", str(bucket_bytes(link)), "latency", "100ms"]
    if not link.delay_ms:
        return [tc + ["root", "handle", "1:", *tbf]]
    return [tc + ["root", "handle", "1:", "netem", "delay", f"{link.delay_ms:g}ms"],
            tc + ["parent", "1:", "handle", "2:", *tbf]]


def own_hostname(address: str) -> list[str]:
    """A UTS namespace whose host name is the address: the namespaces share this machine's name
    otherwise, which resolves to 127.0.x.1, and Gloo ranks would advertise that to each other."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {address} && exec "$@"', "own-hostname"]


def all_or_first_failure(commands: list[list[str]]) -> str:
    """A bash script that starts every command at once and ends with status 0 once all have
    succeeded, or with the first failure's status after stopping the others.

    It polls each child by its pid rather than `wait -n`: a child that has ended before
    `wait -n` is called may already count as waited for, and `wait -n` then answers 127 (no
    child) for a job that succeeded. That failed the 100 Mbit/s DDP cells on 2026-12-04, at
    random. `wait PID` still reports a reaped child's status (bash keeps it)."""
    started = " ".join(f"{shlex.join(cmd)} & pids+=($!);" for cmd in commands)
    return (f"pids=(); {started} left=(\"${{pids[@]}}\"); "
            "while [ ${#left[@]} -gt 0 ]; do running=(); "
            "for pid in \"${left[@]}\"; do "
            "if kill -0 \"$pid\" 2>/dev/null; then running+=(\"$pid\"); continue; fi; "
            "wait \"$pid\"; status=$?; "
            "if [ $status -ne 0 ]; then kill \"${pids[@]}\" 2>/dev/null; exit $status; fi; "
            "done; left=(\"${running[@]}\"); [ ${#left[@]} -gt 0 ] && sleep 0.1; done; exit 0")


def delete_namespace(namespace: str) -> None:
    """Kill what still runs inside (ranks started over ssh outlive a killed launcher), then
    delete it; that deletes the veth end inside it, and with it the peer."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    for pid in pids.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)


def remove_orphans() -> None:
    """Namespaces an earlier bench left behind when it was SIGKILLed (its pid is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        match = re.fullmatch(r"hvdcls-(\d+)-[ab]", name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            delete_namespace(name)


class ShapedHosts:
    """Two namespaces joined by a shaped veth pair, sshd in each; a context manager."""

    def __init__(self, link: Link, slots: int = 1):
        self.link, self.slots = link, slots
        tag = str(os.getpid())
        self.namespaces = [f"hvdcls-{tag}-a", f"hvdcls-{tag}-b"]
        self.addresses = [f"{SUBNET}.1", f"{SUBNET}.2"]
        self.veths = [f"hv{tag}a", f"hv{tag}b"]  # at most 15 characters: pids reach 4194304
        self.sshds: list[subprocess.Popen] = []
        self.scratch: Optional[Path] = None

    def __enter__(self) -> "ShapedHosts":
        reason = unavailable_reason()
        if reason:
            raise UserError(f"cannot make shaped-link hosts: {reason}")
        remove_orphans()
        try:
            self._make_link()
            self._start_sshds()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, *cmd: str) -> None:
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")

    def _make_link(self) -> None:
        for ns in self.namespaces:
            self._run("ip", "netns", "add", ns)
        self._run("ip", "link", "add", self.veths[0], "type", "veth", "peer", "name", self.veths[1])
        for ns, veth, address in zip(self.namespaces, self.veths, self.addresses):
            self._run("ip", "link", "set", veth, "netns", ns)
            self._run("ip", "-n", ns, "link", "set", veth, "name", INTERFACE)
            self._run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", INTERFACE)
            self._run("ip", "-n", ns, "link", "set", INTERFACE, "up")
            self._run("ip", "-n", ns, "link", "set", "lo", "up")
            for cmd in tc_commands(ns, self.link):
                self._run(*cmd)

    def _start_sshds(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="hvdcls-netns-"))
        key, host_key = self.scratch / "id_ed25519", self.scratch / "host_ed25519"
        for path in (key, host_key):
            self._run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path))
        shutil.copy(f"{key}.pub", self.scratch / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        self._forget_host_keys()
        for ns, address in zip(self.namespaces, self.addresses):
            self.sshds.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, *own_hostname(address), "/usr/sbin/sshd", "-D", "-e", "-p", str(SSH_PORT),
                 "-h", str(host_key), "-o", f"ListenAddress={address}",
                 "-o", f"AuthorizedKeysFile={self.scratch / 'authorized_keys'}",
                 "-o", f"PidFile={self.scratch / (ns + '.pid')}", "-o", "StrictModes=no",
                 "-o", "UsePAM=no", "-o", "PasswordAuthentication=no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_for_ssh()

    def _forget_host_keys(self) -> None:
        """horovodrun's ssh records host keys in ~/.ssh/known_hosts (it takes no -o
        UserKnownHostsFile); ours are new each time, so drop what an earlier run recorded for
        these private addresses, before (a changed key would stop ssh) and after."""
        known = Path.home() / ".ssh" / "known_hosts"
        if known.exists():
            for address in self.addresses:
                subprocess.run(["ssh-keygen", "-f", str(known), "-R", f"[{address}]:{SSH_PORT}"],
                               capture_output=True)

    @property
    def identity(self) -> Path:
        """The launcher's ssh key, made by __enter__."""
        assert self.scratch is not None, "use ShapedHosts as a context manager"
        return self.scratch / "id_ed25519"

    def ssh_options(self) -> list[str]:
        return ["-i", str(self.identity), "-p", str(SSH_PORT), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR"]

    def _wait_for_ssh(self) -> None:
        for _ in range(50):
            if all(subprocess.run(self.in_first(["ssh", *self.ssh_options(), address, "true"]),
                                  capture_output=True).returncode == 0 for address in self.addresses):
                return
            time.sleep(0.2)
        raise UserError("sshd in the shaped-link namespaces did not answer within 10 s")

    def in_first(self, cmd: list[str]) -> list[str]:
        """Run `cmd` in the first host's namespace (where the launcher lives)."""
        return ["ip", "netns", "exec", self.namespaces[0], *own_hostname(self.addresses[0]), *cmd]

    def horovodrun(self, np: int, program: list[str], horovodrun: str = "horovodrun") -> list[str]:
        hosts = ",".join(f"{address}:{self.slots}" for address in self.addresses)
        return self.in_first([horovodrun, "--gloo", "-np", str(np), "-H", hosts, "-p", str(SSH_PORT),
                              "--ssh-identity-file", str(self.identity),
                              "--network-interface", INTERFACE, *program])

    def on_each(self, commands: list[list[str]]) -> list[str]:
        """One command that runs commands[i] on host i (in its namespace, under its own host
        name), all at once, for launchers without ssh (torchrun's nodes); the first to fail
        stops the others and its status is the command's."""
        return ["bash", "-c", all_or_first_failure(
            [["ip", "netns", "exec", ns, *own_hostname(address), *cmd]
             for ns, address, cmd in zip(self.namespaces, self.addresses, commands)])]

    def close(self) -> None:
        for sshd in self.sshds:
            sshd.terminate()
        for sshd in self.sshds:
            try:
                sshd.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sshd.kill()
        self._forget_host_keys()
        for ns in self.namespaces:
            delete_namespace(ns)
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def cpu_seconds(self) -> float:
        """CPU seconds of every process in the namespaces, with what they reaped: the sshds hold
        the ranks they started (no descendants of the bench's, so the guard adds these)."""
        total = 0.0
        for ns in self.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
            total += sum(guard.process_seconds(int(pid)) for pid in pids.split() if pid.isdigit())
        return total

    def exists(self) -> list[str]:
        """The namespaces of ours that still exist (for tests of the tear-down)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        names = {line.split()[0] for line in listed.splitlines() if line.strip()}
        return [ns for ns in self.namespaces if ns in names]
