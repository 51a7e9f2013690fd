"""One job on disk and as processes: its run directory, its `horovodrun` command, its process group.

    RUN_DIR/spec.json         the spec as submitted
    RUN_DIR/job.yaml          the validated config it runs with (`hvdcls train --config`)
    RUN_DIR/hostfile          its allocation, one `host slots=N` line per host
    RUN_DIR/discover.sh       elastic jobs: Horovod's discovery script, printing ...
    RUN_DIR/allocation        ... the job's current slots (HOST:SLOTS lines), which the service
                              rewrites to shrink or grow it
    RUN_DIR/stdout.log        horovodrun's output: every rank's lines
    RUN_DIR/stderr.log
    RUN_DIR/exit_status.json  written by the wrapper when horovodrun ends
    RUN_DIR/metrics.jsonl, summary.json, checkpoints/, ...   what `hvdcls train` writes

The job runs as `python -m hvdcls.serve.wrapper RUN_DIR -- horovodrun ...` in a new session:
its own process group (cancel signals the group), independent of the service, so a restart
of the service finds it still running and the wrapper's exit_status.json tells how it ended.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

from hvdcls import config as cfg
from hvdcls import launch
from hvdcls.fileio import write_atomic, write_json_atomic

SPEC, JOB_CONFIG, HOSTFILE = "spec.json", "job.yaml", "hostfile"
DISCOVERY, ALLOCATION = "discover.sh", "allocation"
STDOUT, STDERR, EXIT = "stdout.log", "stderr.log", "exit_status.json"
METRICS = "metrics.jsonl"  # hvdcls train's: one line per epoch
# hvdcls train's progress line (output.progress=lines), behind horovodrun's `[1,0]<stdout>:`.
PROGRESS = re.compile(r"epoch (\d+)/(\d+) step (\d+)/(\d+) ")
# Rank 0's line when it serves /metrics (output.metrics_port): said again by a new rank 0 after an
# elastic reset, so the last one in the log is where the job's metrics are now.
ENDPOINT = re.compile(rb"metrics: Prometheus endpoint on http://(\S+)/metrics")
# A checkpoint as hvdcls.training.checkpoint writes it (the service does not import training).
CHECKPOINTS = "checkpoints/epoch-*/state.json"


def prepare(run_dir: Path, spec: dict, config: cfg.Config, allocation: dict[str, int]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / SPEC, spec)
    write_atomic(run_dir / JOB_CONFIG, cfg.to_yaml(config).encode())
    write_atomic(run_dir / HOSTFILE, "".join(f"{h} slots={n}\n" for h, n in allocation.items()).encode())
    (run_dir / EXIT).unlink(missing_ok=True)  # a requeued job's previous attempt
    if config.training.elastic:
        write_allocation(run_dir, allocation)
        write_atomic(run_dir / DISCOVERY, f"#!/bin/sh\nexec cat {run_dir / ALLOCATION}\n".encode())
        (run_dir / DISCOVERY).chmod(0o755)


def write_allocation(run_dir: Path, allocation: dict[str, int]) -> None:
    """What an elastic job's discovery script prints from now on."""
    write_atomic(run_dir / ALLOCATION, "".join(f"{h}:{n}\n" for h, n in allocation.items()).encode())


def command(run_dir: Path, spec: dict, allocation: dict[str, int], ssh_port: Optional[int] = None,
            network_interface: Optional[str] = None) -> list[str]:
    """The wrapper around `horovodrun` (elastic: bounded by min_np/max_np, hosts from the
    discovery script) around `hvdcls train --config RUN_DIR/job.yaml`."""
    train = launch.hvdcls_command("train", "--backend", spec["backend"], "--config", str(run_dir / JOB_CONFIG))
    train = (["-p", str(ssh_port)] if ssh_port else []) + train  # options before the command
    np = sum(allocation.values())
    if spec["elastic"]:
        horovodrun = launch.horovodrun_elastic(np, spec["min_np"], spec["max_np"], str(run_dir / DISCOVERY),
                                               train, network_interface=network_interface)
    else:
        horovodrun = launch.horovodrun(np, train, hosts=allocation)
    return [sys.executable, "-m", "hvdcls.serve.wrapper", str(run_dir), "--", *horovodrun]


def start(run_dir: Path, cmd: list[str]) -> subprocess.Popen:
    """Start the job in its own session (process group id = its pid), output into the run dir."""
    with open(run_dir / STDOUT, "ab") as out, open(run_dir / STDERR, "ab") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=launch.single_host_env(), cwd=run_dir, start_new_session=True)


def start_time(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (/proc), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name


def alive(pid: int, started: Optional[int]) -> bool:
    """Is the process we started still there (and not another one that got its pid)?"""
    now = start_time(pid)
    if now is None:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z" and (started is None or now == started)


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exit_status(run_dir: Path) -> Optional[int]:
    record = exit_record(run_dir)
    return record.get("returncode") if record else None


def exit_record(run_dir: Path) -> Optional[dict]:
    """The wrapper's exit_status.json (returncode, terminated, seconds), None before it ends."""
    try:
        record = json.loads((run_dir / EXIT).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def tail(path: Path, lines: int = 20, max_bytes: int = 16384) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - max_bytes))
            return handle.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def last_output(run_dir: Path) -> float:
    """When the job last wrote to stdout or stderr (0 when it has not)."""
    times = [(run_dir / name).stat().st_mtime for name in (STDOUT, STDERR) if (run_dir / name).exists()]
    return max(times, default=0.0)


def progress(run_dir: Path, epochs: Optional[int] = None) -> Optional[dict]:
    """How far the run is: the last progress line (epoch, step, fraction of all steps), else
    the epochs finished (metrics.jsonl) out of `epochs`, when the job prints no step lines."""
    for line in reversed(tail(run_dir / STDOUT, lines=200)):
        found = PROGRESS.search(line)
        if found:
            epoch, total, step, steps = map(int, found.groups())
            return {"epoch": epoch, "epochs": total, "step": step, "steps_per_epoch": steps,
                    "fraction": ((epoch - 1) * steps + step) / (total * steps)}
    record = last_metrics(run_dir)  # its epoch counts the epochs finished, however long the file
    finished = record.get("epoch") if isinstance(record, dict) else None
    if epochs and finished:
        return {"epoch": finished, "epochs": epochs, "step": None, "steps_per_epoch": None,
                "fraction": finished / epochs}
    return None


def last_metrics(run_dir: Path) -> Optional[dict]:
    lines = tail(run_dir / METRICS, lines=1)
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def has_checkpoint(run_dir: Path) -> bool:
    return any(run_dir.glob(CHECKPOINTS))


def failure_message(run_dir: Path, reason: str, lines: int = 20) -> str:
    """The reason with the ranks' own one-line error (`hvdcls: error: ...`) when there is one,
    then the last lines of the job's output (stderr, else stdout)."""
    last = tail(run_dir / STDERR, lines=200) or tail(run_dir / STDOUT, lines=200)
    said = [line.split("hvdcls: error: ", 1)[1] for line in last if "hvdcls: error: " in line]
    return "\n".join([f"{reason}: {said[0]}" if said else reason, *last[-lines:]])


class Endpoints:
    """Where each running job's rank 0 serves /metrics, from its log, read once: each call
    reads only what the log gained since the last (a job's log grows for hours). The API
    answers from several threads: one lock."""

    def __init__(self):
        self.read: dict[Path, tuple[int, Optional[str]]] = {}  # log -> (bytes read, last endpoint)
        self.lock = threading.Lock()

    def of(self, run_dir: Path) -> Optional[str]:
        path = run_dir / STDOUT
        with self.lock:
            position, endpoint = self.read.get(path, (0, None))
            try:
                with open(path, "rb") as handle:
                    if handle.seek(0, os.SEEK_END) < position:  # started afresh (sbatch truncates)
                        position, endpoint = 0, None
                    handle.seek(position)
                    chunk = handle.read()
            except OSError:
                return endpoint
            complete = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits for its end
            found = ENDPOINT.findall(complete)
            if found:
                endpoint = found[-1].decode(errors="replace")
            self.read[path] = (position + len(complete), endpoint)
            return endpoint

    def forget(self, running: set[Path]) -> None:
        """Drop the logs of jobs no longer running (a requeued job's is read afresh)."""
        with self.lock:
            for log in set(self.read) - {run_dir / STDOUT for run_dir in running}:
                del self.read[log]
