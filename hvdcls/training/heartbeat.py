"""The watchdog's side channel: small UDP datagrams from every rank to rank 0.

Rank 0 opens a socket on a free port and announces (host, port) to the others with the
job's own broadcast at start; each rank's watchdog then sends, once a second,

    {"kind": "beat", "rank": 1, "host": "worker2", "phase": "reading data", "step": 3, "in_phase": 2.0}

and, when its watchdog ends it, a "stop" datagram that rank 0 acknowledges once it has
written the run's last record. Everything here is best effort: a datagram lost or a socket
error never reaches training; rank 0 judges silence by its own clock only.
"""
from __future__ import annotations

import json
import os
import select
import socket
import time
from dataclasses import dataclass
from typing import Callable, Optional

SILENT_SECONDS = 10.0  # rank 0 says so once a rank has sent nothing for this long
QUIET_SECONDS = 3.0  # blame(): a rank silent this long is named when the job ends
MAX_DATAGRAM = 4096


def announced_host() -> str:
    """Where the other ranks can reach rank 0: the address this host uses towards Gloo's
    rendezvous server (horovodrun), else the host name (mpirun: resolved by each rank)."""
    target = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    if target:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))  # UDP: picks the route, sends nothing
                return probe.getsockname()[0]
        except OSError:
            pass
    return socket.gethostname()


def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()[:MAX_DATAGRAM]


class Sender:
    """Ranks other than 0: fire-and-forget datagrams to rank 0's board."""

    def __init__(self, address: tuple[str, int]):
        self.address = address
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def _send(self, message: dict) -> None:
        try:
            self.sock.sendto(encode(message), self.address)
        except OSError:
            pass  # rank 0 gone or unreachable: its own watchdog or the launcher speaks

    def beat(self, rank: int, host: str, report: dict) -> None:
        self._send({"kind": "beat", "rank": rank, "host": host, **report})

    def stopping(self, rank: int, host: str, stop: dict, wait: float) -> bool:
        """Tell rank 0 this rank ends; True once rank 0 acknowledged (within `wait` s)."""
        message = {"kind": "stop", "rank": rank, "host": host, "stop": stop}
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._send(message)
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], min(0.5, left))
            if ready:
                try:
                    if json.loads(self.sock.recv(MAX_DATAGRAM)).get("kind") == "ack":
                        return True
                except (OSError, ValueError):
                    pass
        return False

    def close(self) -> None:
        self.sock.close()


@dataclass
class Peer:
    host: str = "?"
    phase: Optional[str] = None
    step: Optional[int] = None
    heard: Optional[float] = None  # rank 0's monotonic clock
    said_silent: bool = False
    beats: int = 0


class Board:
    """Rank 0: who said what when, and who went silent."""

    def __init__(self, size: int, clock: Callable[[], float] = time.monotonic, bind_host: str = ""):
        self.clock = clock
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((bind_host, 0))
        self.sock.setblocking(False)
        self.started = clock()
        self.peers = {rank: Peer() for rank in range(1, size)}
        self.stopped: Optional[dict] = None
        self.stopper: Optional[tuple] = None

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def listen(self, timeout: float, say: Callable[[str], None],
               done: Callable[[], bool] = lambda: False) -> None:
        """Take what arrives within `timeout` s (less once done() or a rank stops), then say
        which ranks fell silent."""
        deadline = self.clock() + timeout
        while True:
            left = deadline - self.clock()
            ready, _, _ = select.select([self.sock], [], [], min(0.2, max(0.0, left)))
            if ready:
                self._receive()
            if left <= 0 or self.stopped is not None or done():
                break
        for line in self.newly_silent():
            say(line)

    def _receive(self) -> None:
        try:
            data, sender = self.sock.recvfrom(MAX_DATAGRAM)
            self.take(json.loads(data), sender)
        except (OSError, ValueError, TypeError, KeyError):
            pass  # a stray or broken datagram is not ours to act on

    def take(self, message: dict, sender: Optional[tuple] = None) -> None:
        peer = self.peers.get(int(message["rank"]))
        if peer is None:
            return
        peer.host, peer.heard, peer.said_silent = str(message["host"]), self.clock(), False
        if message["kind"] == "beat":
            peer.phase, peer.step = message.get("phase"), message.get("step")
            peer.beats += 1
        elif message["kind"] == "stop" and self.stopped is None:
            self.stopped, self.stopper = dict(message["stop"]), sender

    def acknowledge(self) -> None:
        if self.stopper is not None:
            try:
                self.sock.sendto(encode({"kind": "ack"}), self.stopper)
            except OSError:
                pass

    def silence(self, rank: int) -> float:
        peer = self.peers[rank]
        return self.clock() - (peer.heard if peer.heard is not None else self.started)

    def describe(self, rank: int) -> str:
        peer, seconds = self.peers[rank], self.silence(rank)
        if peer.heard is None:
            return f"rank {rank}: no heartbeat for {seconds:.0f} s (none received)"
        last = peer.phase if peer.step is None else f"{peer.phase}, step {peer.step}"
        return f"rank {rank} ({peer.host}): no heartbeat for {seconds:.0f} s (last: {last})"

    def heard_from(self) -> dict:
        """For the summary: {"1": {"host": "worker2", "beats": 37}, ...}, every rank of the
        world, each as it named its host (beats 0: never heard)."""
        return {str(rank): {"host": peer.host, "beats": peer.beats}
                for rank, peer in self.peers.items()}

    def newly_silent(self) -> list[str]:
        lines = []
        for rank, peer in self.peers.items():
            if not peer.said_silent and self.silence(rank) > SILENT_SECONDS:
                peer.said_silent = True
                lines.append(self.describe(rank))
        return lines

    def silent_phrase(self) -> Optional[str]:
        quiet = [self.describe(rank) for rank in self.peers if self.silence(rank) > QUIET_SECONDS]
        return "; ".join(quiet) or None

    def close(self) -> None:
        self.sock.close()
