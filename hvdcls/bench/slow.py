"""`hvdcls bench --slow-rank R=F`: rank R runs with F of the CPU the other ranks get, for real.

A mixed cluster made on one machine: a cgroup (v1 `cpu` controller, as root) whose
cpu.cfs_quota_us is F x the rank's threads x cpu.cfs_period_us. The bench makes the cgroup for
the run and prefixes every rank's command with this module, which moves the process into it
when its rank (Horovod's HOROVOD_RANK, mpirun's OMPI_COMM_WORLD_RANK, torchrun's RANK) is R and
then exec()s the real command, so the rank itself, and every thread it starts, is throttled.

    python -m hvdcls.bench.slow --cgroup DIR --rank R -- COMMAND...
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from hvdcls.errors import UserError

CPU_CONTROLLER = Path("/sys/fs/cgroup/cpu")
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK")


@dataclass(frozen=True)
class SlowRank:
    rank: int
    fraction: float  # of the CPU the other ranks get

    @classmethod
    def parse(cls, text: str) -> "SlowRank":
        """'1=0.5' -> rank 1 at half speed; a UserError naming the flag otherwise."""
        rank, sep, fraction = text.partition("=")
        try:
            slow = cls(int(rank), float(fraction))
        except ValueError:
            slow = None
        if not sep or slow is None or slow.rank < 0 or not 0 < slow.fraction <= 1:
            raise UserError(f"--slow-rank {text}: give RANK=FRACTION, e.g. 1=0.5 (rank 1 at half "
                            "the CPU of the others; 0 < FRACTION <= 1)")
        return slow


def quota_us(fraction: float, threads: int, period_us: int) -> int:
    return max(1000, int(fraction * threads * period_us))  # the kernel's minimum is 1 ms


@contextlib.contextmanager
def throttled_cgroup(slow: SlowRank, root: Path = CPU_CONTROLLER) -> Iterator[tuple[Path, int]]:
    """(a cgroup under `root`, the slow rank) for the run; set_threads() sizes its quota for each
    cell. Removed afterwards (its processes have ended by then)."""
    group = root / f"hvdcls-bench-{os.getpid()}"
    try:
        group.mkdir()
        set_threads(group, slow.fraction, 1)
    except OSError as err:
        with contextlib.suppress(OSError):
            group.rmdir()
        raise UserError(f"--slow-rank needs root and the cgroup v1 cpu controller at {root} "
                        f"({err.strerror or err}); see docs/balancing.md") from None
    try:
        yield group, slow.rank
    finally:
        remove(group)


def remove(group: Path, attempts: int = 50) -> None:
    """rmdir the cgroup once its processes are gone (a killed rank takes a moment to be)."""
    for _ in range(attempts):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: a process is still in it
            time.sleep(0.1)


def set_threads(group: Path, fraction: float, threads: int) -> None:
    """Limit `group` to `fraction` of `threads` cores (what each rank of the cell may use)."""
    period = int((group / "cpu.cfs_period_us").read_text())
    (group / "cpu.cfs_quota_us").write_text(str(quota_us(fraction, threads, period)))


def wrap(command: list[str], group: Path, rank: int) -> list[str]:
    """`command` prefixed so that the process of rank `rank` runs inside `group`."""
    return [sys.executable, "-m", "hvdcls.bench.slow", "--cgroup", str(group), "--rank", str(rank),
            "--", *command]


def my_rank(environ=os.environ) -> int | None:
    for name in RANK_VARIABLES:
        if name in environ:
            return int(environ[name])
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cgroup", type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if my_rank() == args.rank:
        (args.cgroup / "cgroup.procs").write_text(str(os.getpid()))  # this process, all its threads
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
