"""Every rank's step watchdog: no job hangs past a bound, whatever the controller.

Horovod 0.28.1's stall inspector works only under the MPI controller; under Gloo a rank that
stops submitting tensors leaves the others waiting for ever (docs/elastic-and-reliability.md,
"Stalls"). So each rank runs a daemon thread that knows the phase its rank is in (`Phases`,
set by the step loop) and how long it has been there. When a phase outlasts its limit, it
prints one line naming the rank, its host, its phase and how long, has the run's last record
written (rank 0), and ends the process with EXIT_STALLED; the launcher then ends the job,
and Horovod's elastic mode counts it as a failed worker and goes on without it.

Limits (training.stall_timeout_seconds, T): T in each phase; SLOW_FACTOR x T from the start
of a run, of an elastic world and of every epoch end until the next step has completed (a
first-step compile, an evaluation's first batch, rank 0 drawing its report, loader workers
starting, a peer still writing a checkpoint), and while writing a checkpoint or committing
elastic state; a rank that waits for others (in an
all-reduce) gets a grace more, so that the rank it waits for, when alive, is the one that
speaks first; re-forming an elastic world has no limit (Horovod's --elastic-timeout bounds it).

Heartbeats (several ranks): every rank sends (rank, host, step, phase) over UDP each second
to a socket rank 0 opens and announces with a broadcast (hvdcls.training.heartbeat), so rank
0 names a rank that cannot speak for itself (stopped, swapped out, host gone), and a stopping
rank tells rank 0 first, so rank 0 records which rank stopped the job. A plain run announces
once at start; an elastic one after every (re)start of its world (`Watchdog.rewire`), where
rank 0 may be another process and the world another size. There a rank its watchdog ends is
one failed worker: rank 0 says so and the job goes on.

While reading data, the loop gives the phase a `detail` (which loader worker holds the batch
waited for, hvdcls.backend.Backend.loader_worker), asked only when the phase is overdue.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from hvdcls.training.heartbeat import Board, Sender, announced_host

# sysexits' EX_TEMPFAIL: unused by hvdcls (0, 1, 2, 130) and by the test hooks (3).
EXIT_STALLED = 75

STARTING = "starting"
READING = "reading data"
COMPUTING = "computing"
ALLREDUCE = "waiting in the all-reduce"
# A backend whose compiled step interleaves the all-reduce with backward (TensorFlow) cannot
# say which of the two it is in; this phase says so rather than guessing.
IN_STEP = "in the step (computing or waiting in the all-reduce)"
EPOCH_COLLECTIVES = "waiting in the epoch end's all-reduce"
EVALUATING = "evaluating"
RECORDING = "recording the epoch (metrics, report, watchers)"
CHECKPOINTING = "checkpointing"
COMMITTING = "committing the elastic state"
RESETTING = "re-forming the elastic world"
FINISHING = "finishing the run (summary)"

SLOW_FACTOR = 3
SLOW = {STARTING, CHECKPOINTING, COMMITTING}
WAITING = {ALLREDUCE, IN_STEP, EPOCH_COLLECTIVES}
UNBOUNDED = {RESETTING}
CHECK_SECONDS = 1.0  # how often the thread looks (and sends a heartbeat)
ACK_SECONDS = 2.0  # how long a stopping rank waits for rank 0 to record it


def grace(timeout: float) -> float:
    """What a waiting rank allows beyond `timeout`: the rank it waits for speaks first."""
    return max(5.0, 0.1 * timeout)


@dataclass(frozen=True)
class Where:
    """One moment of a rank: its phase, the step it is at, since when (monotonic seconds), and
    what can tell more about it when it is overdue (None: nothing)."""

    phase: str
    step: Optional[int]
    since: float
    detail: Optional[Callable[[], Optional[str]]] = None


@dataclass(frozen=True)
class Stall:
    phase: str
    step: Optional[int]
    in_phase: float  # seconds in the phase
    since_step: float  # seconds since the last completed step (or the start)
    detail: Optional[str] = None  # "loader worker 1, pid 4242"


class Phases:
    """Where this rank is: written by the training thread, read by the watchdog's. Each write
    replaces one immutable `Where`, so the reader never sees half an update.
    timeout 0: nothing is ever overdue (the watchdog is off)."""

    def __init__(self, timeout: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self.timeout, self.clock = float(timeout), clock
        now = clock()
        self.where = Where(STARTING, None, now)
        self.last_step = now
        self.stepped = False  # False: the first step (of a run, world or epoch) is still to come

    def enter(self, phase: str, step: Optional[int] = None,
              detail: Optional[Callable[[], Optional[str]]] = None) -> None:
        self.where = Where(phase, self.where.step if step is None else step, self.clock(), detail)

    def beat(self) -> None:
        """Progress inside the phase (an evaluation batch): its clock starts again."""
        where = self.where
        self.where = Where(where.phase, where.step, self.clock(), where.detail)

    def step_done(self, step: int) -> None:
        self.last_step, self.stepped = self.clock(), True
        self.where = Where(self.where.phase, step, self.last_step)

    def restart(self) -> None:
        """A new world (elastic): the first step gets the start-up allowance again."""
        self.stepped = False
        self.enter(STARTING)

    def slow_until_step(self, phase: str, step: Optional[int] = None,
                        detail: Optional[Callable[[], Optional[str]]] = None) -> None:
        """Enter `phase` with the start-up allowance, held until the next step completes: an
        epoch's end (a first evaluation compiles, rank 0 draws its report) and its first step."""
        self.stepped = False
        self.enter(phase, step, detail)

    def limit(self, phase: str) -> Optional[float]:
        """Seconds `phase` may last; None: no limit."""
        if not self.timeout or phase in UNBOUNDED:
            return None
        limit = self.timeout * (SLOW_FACTOR if phase in SLOW or not self.stepped else 1)
        return limit + (grace(self.timeout) if phase in WAITING else 0.0)

    def overdue(self, now: Optional[float] = None) -> Optional[Stall]:
        where, now = self.where, self.clock() if now is None else now
        limit = self.limit(where.phase)
        if limit is None or now - where.since <= limit:
            return None
        return Stall(where.phase, where.step, now - where.since, now - self.last_step,
                     ask(where.detail))

    def report(self, now: Optional[float] = None) -> dict:
        """What a heartbeat carries: the phase, the step, seconds in the phase."""
        where, now = self.where, self.clock() if now is None else now
        return {"phase": where.phase, "step": where.step, "in_phase": round(now - where.since, 1)}


def ask(detail: Optional[Callable[[], Optional[str]]]) -> Optional[str]:
    """What `detail` says; None when it has nothing or fails (it looks into a loader's
    internals from another thread: a guess at best, never a reason to stay silent)."""
    try:
        return detail() if detail is not None else None
    except Exception:
        return None


def describe(phase: str, step: Optional[int], detail: Optional[str] = None) -> str:
    """`reading data (step 3, loader worker 1, pid 4242)`"""
    said = [f"step {step}"] * (step is not None) + ([detail] if detail else [])
    return f"{phase} ({', '.join(said)})" if said else phase


def stall_line(rank: int, host: str, stall: Stall) -> str:
    """`rank 1 (worker2): no step for 600 s, stuck reading data (step 3) for 598 s`"""
    return (f"rank {rank} ({host}): no step for {stall.since_step:.0f} s, stuck "
            f"{describe(stall.phase, stall.step, stall.detail)} for {stall.in_phase:.0f} s")


def host_name() -> str:
    """This rank's host as the launcher names it (horovodrun's -H or discovery script: the
    name Horovod blacklists), else as the host names itself (mpirun)."""
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def say(line: str) -> None:
    print(f"hvdcls: watchdog: {line}", file=sys.stderr, flush=True)


class Watchdog:
    """The thread. `last_record(stop)` is called (rank 0) before the process ends, with a dict
    naming the stalled rank; it must not raise, and is guarded anyway. `elastic`: a peer its
    watchdog ends is a failed worker the job survives, not the job's end."""

    def __init__(self, phases: Phases, rank: int, host: str, sender: Optional[Sender] = None,
                 board: Optional[Board] = None, end: Callable[[int], None] = os._exit,
                 elastic: bool = False):
        self.phases, self.rank, self.host = phases, rank, host
        self.sender, self.board, self.end, self.elastic = sender, board, end, elastic
        self.last_record: Callable[[dict], None] = lambda stop: None
        self.done = threading.Event()
        # The channels change under rewire() (training thread) while tick() uses them.
        self.wiring, self.rewiring = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="hvdcls-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        if self.phases.timeout:
            self.hello()
            self.thread.start()
        return self

    def hello(self) -> None:
        """A first heartbeat at once: rank 0 knows this rank's host before the first round."""
        if self.sender is not None:
            self.sender.beat(self.rank, self.host, self.phases.report())

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2 * CHECK_SECONDS)
        with self.wiring:
            self._close_channels()

    def _close_channels(self) -> None:
        for channel in (self.sender, self.board):
            if channel is not None:
                channel.close()
        self.sender, self.board = None, None

    def rewire(self, rank: int, size: int, share: Callable[[object], object]) -> None:
        """A new elastic world (every rank calls it, after the state sync): this process's
        rank now, and heartbeats to the new world's rank 0 (a broadcast inside)."""
        if not self.phases.timeout:
            return
        sender, board = channels(rank, size, share)
        self.rewiring.set()  # rank 0's thread stops listening to the old board
        with self.wiring:
            self.rewiring.clear()
            self._close_channels()
            self.rank, self.sender, self.board = rank, sender, board
            self.hello()

    def heard(self) -> Optional[dict]:
        """Rank 0: the heartbeats its board received, per rank (None: no board)."""
        board = self.board
        return board.heard_from() if board else None

    def blame(self) -> Optional[str]:
        """Rank 0: the ranks whose heartbeats stopped, in one phrase (None: none known)."""
        board = self.board
        return board.silent_phrase() if board else None

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                with self.wiring:
                    listened = self.tick()
            except Exception as err:  # never let the watchdog itself end a healthy run
                say(f"rank {self.rank}: watchdog error ignored: {err!r}")
                listened = False
            if self.rewiring.is_set():
                time.sleep(0.01)  # the lock is rewire()'s turn
            elif not listened:
                self.done.wait(CHECK_SECONDS)

    def tick(self) -> bool:
        """One round: heartbeat out (or in, on rank 0), then this rank's own deadline. True
        when it listened (rank 0): that took the round's second."""
        if self.sender is not None:
            self.sender.beat(self.rank, self.host, self.phases.report())
        board = self.board
        if board is not None:
            board.listen(CHECK_SECONDS, say, lambda: self.done.is_set() or self.rewiring.is_set())
            if board.stopped is not None and not self.done.is_set():
                self._peer_stopped(board)
        stall = self.phases.overdue()
        if stall is not None and not self.done.is_set():
            self._stalled(stall)
        return board is not None

    def _stalled(self, stall: Stall) -> None:
        line = stall_line(self.rank, self.host, stall)
        silent = self.blame()
        say(line + (f"; {silent}" if silent else ""))
        stop = {"by": "watchdog", "rank": self.rank, "host": self.host, "phase": stall.phase,
                "step": stall.step, "seconds": round(stall.in_phase, 1), "message": line,
                "silent": silent, "detail": stall.detail}
        if self.sender is not None:
            self.sender.stopping(self.rank, self.host, stop, ACK_SECONDS)
        self._finish(stop)

    def _peer_stopped(self, board: Board) -> None:
        """Rank 0, told by another rank that its watchdog ends it: say where this rank is, and
        end too (the job cannot go on) or, elastic, let Horovod go on without it."""
        stop, here = board.stopped, self.phases.report()
        assert stop is not None  # the board said a rank stopped
        said = (f"rank {stop['rank']} ({stop['host']}) stopped by its watchdog: {stop['message']}; "
                f"rank {self.rank} ({self.host}): {describe(here['phase'], here['step'])} for "
                f"{here['in_phase']:.0f} s")
        if not self.elastic:
            say(said)
            self._finish(stop)
            return
        say(f"{said}; elastic: the job goes on without rank {stop['rank']}")
        board.acknowledge()
        board.stopped = None

    def _finish(self, stop: dict) -> None:
        self.done.set()
        try:
            self.last_record(stop)
        except Exception as err:
            say(f"rank {self.rank}: could not write the last record: {err!r}")
        finally:
            if self.board is not None:
                self.board.acknowledge()
            sys.stderr.flush()
            self.end(EXIT_STALLED)


def channels(rank: int, size: int,
             share: Callable[[object], object]) -> tuple[Optional[Sender], Optional[Board]]:
    """This rank's heartbeat channel in a world of `size`: rank 0 opens a board and `share`s
    its address (a broadcast every rank joins), the others send to it."""
    if size < 2:
        return None, None
    address: object = None
    board: Optional[Board] = None
    if rank == 0:
        try:
            board = Board(size)
            address = (announced_host(), board.port)
        except OSError as err:  # no heartbeats then; every rank must still join the broadcast
            say(f"rank 0: no heartbeat socket ({err}); each rank watches itself only")
    address = share(address)
    if rank != 0 and isinstance(address, (tuple, list)):
        return Sender((address[0], int(address[1]))), None
    return None, board


def start(timeout: float, rank: int, size: int, share: Optional[Callable[[object], object]],
          host: Optional[str] = None, elastic: bool = False) -> Watchdog:
    """This rank's watchdog, running unless timeout is 0. `share(obj)`: rank 0's obj on every
    rank (a broadcast every rank calls); None where no collective may run now (elastic mode
    before its first sync: `Watchdog.rewire` wires the heartbeats once it may)."""
    sender, board = None, None
    if timeout and share is not None:
        sender, board = channels(rank, size, share)
    return Watchdog(Phases(timeout), rank, host or host_name(), sender, board,
                    elastic=elastic).start()
