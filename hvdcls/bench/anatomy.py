"""Where a training step's time goes, seen from inside each rank: the probe that
tools/step_anatomy.py puts in the bench worker and in the DDP baseline (`--anatomy DIR`).

    probe = Probe(directory, rank, hooks=True)
    probe.watch_gradients(model.named_parameters())   # when each gradient is ready (torch)
    step = probe.timed(step)                          # when each step starts and ends
    with probe.window():                              # the timed steps
        ...

Around the window it reads every thread of this process from /proc/self/task: CPU time
(utime + stime), the time spent runnable but waiting for a core (schedstat), and the voluntary
and involuntary context switches (a thread that wakes every cycle shows as voluntary switches;
one pushed off its core as involuntary). With hooks, it records, inside the window only, when
each parameter's gradient was accumulated (a post-accumulate-grad hook, duck-typed: no torch
import here) and, for DDP, each bucket's communication (`reduced`, from a comm hook). Times are
wall-clock nanoseconds (time.time_ns), the clock Horovod's timeline states its start in, so the
two can be laid over each other. Entering the window writes `rank<R>.started` (the pid), so an
outside sampling profiler knows when to attach; leaving it writes `rank<R>.json`.
Framework-free; nothing here changes the step.
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from hvdcls.files import fileio

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_thread(task: Path) -> dict | None:
    """One thread's counters from /proc/<pid>/task/<tid>, or None if it has gone."""
    try:
        stat = (task / "stat").read_text()
        name = (task / "comm").read_text().strip()
        status = (task / "status").read_text()
        schedstat = (task / "schedstat").read_text().split() if (task / "schedstat").exists() else []
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
    switches = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
                if line.endswith(tuple("0123456789")) and "ctxt_switches" in line}
    return {"name": name,
            "cpu_seconds": (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND,  # utime, stime
            "run_seconds": int(schedstat[0]) / 1e9 if schedstat else None,
            "runqueue_wait_seconds": int(schedstat[1]) / 1e9 if schedstat else None,
            "voluntary_switches": switches.get("voluntary_ctxt_switches", 0),
            "involuntary_switches": switches.get("nonvoluntary_ctxt_switches", 0)}


def thread_counters(pid: int | str = "self") -> dict[int, dict]:
    """Every thread of a process: tid -> its counters (read_thread)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        counters = read_thread(task)
        if counters is not None:
            out[int(task.name)] = counters
    return out


COUNTERS = ("cpu_seconds", "run_seconds", "runqueue_wait_seconds", "voluntary_switches",
            "involuntary_switches")


def counters_between(before: dict[int, dict], after: dict[int, dict]) -> dict[int, dict]:
    """What each thread used between two readings; a thread born in between counts from zero."""
    out = {}
    for tid, now in after.items():
        then = before.get(tid, {})
        out[tid] = {"name": now["name"], **{key: None if now[key] is None else
                                            now[key] - (then.get(key) or 0) for key in COUNTERS}}
    return out


class Probe:
    def __init__(self, directory: Path, rank: int, hooks: bool = True):
        self.directory, self.rank, self.hooks = Path(directory), rank, hooks
        self.recording = False
        self.steps: list[list[int]] = []  # [start ns, end ns] per step in the window
        self.ready: list[tuple[int, str, int]] = []  # (step, parameter, ns its gradient was ready)
        self.reductions: list[tuple[int, str, int, int, int]] = []  # (step, name, start, end, bytes)

    def watch_gradients(self, named_parameters: Iterable) -> None:
        """A hook per trainable parameter noting when its gradient is accumulated (torch's
        register_post_accumulate_grad_hook); nothing without hooks."""
        if not self.hooks:
            return
        for name, parameter in named_parameters:
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self._ready(name))

    def _ready(self, name: str) -> Callable:
        def hook(_parameter) -> None:
            if self.recording:
                self.ready.append((len(self.steps) - 1, name, time.time_ns()))
        return hook

    def reduced(self, name: str, started_ns: int, ended_ns: int, num_bytes: int) -> None:
        """One collective of this step (DDP's comm hook reports each bucket's)."""
        if self.recording:
            self.reductions.append((len(self.steps) - 1, name, started_ns, ended_ns, num_bytes))

    def timed(self, step: Callable) -> Callable:
        def timed_step(*args, **kwargs):
            if not self.recording:
                return step(*args, **kwargs)
            span = [time.time_ns(), 0]
            self.steps.append(span)
            try:
                return step(*args, **kwargs)
            finally:
                span[1] = time.time_ns()
        return timed_step

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        before, started = thread_counters(), time.time_ns()
        self.recording = True
        fileio.write_json_atomic(self.directory / f"rank{self.rank}.started",
                                 {"pid": os.getpid(), "started_ns": started})
        try:
            yield
        finally:
            self.recording = False
            after, ended = thread_counters(), time.time_ns()
            fileio.write_json_atomic(self.directory / f"rank{self.rank}.json", {
                "rank": self.rank, "pid": os.getpid(), "window_ns": [started, ended],
                "threads": {str(tid): c for tid, c in counters_between(before, after).items()},
                "steps": self.steps, "ready": self.ready, "reductions": self.reductions})
