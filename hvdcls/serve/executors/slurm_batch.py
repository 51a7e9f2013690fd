"""Slurm for hvdcls.serve.executors.slurm: the batch script, the calls (sbatch, squeue,
scancel) and what their answers mean.

A job becomes one batch job whose script, inside its allocation, asks this module for the hosts
(`python -m hvdcls.serve.executors.slurm_batch hosts RUN_DIR`: `scontrol show hostnames
$SLURM_JOB_NODELIST`, slots from `$SLURM_TASKS_PER_NODE`), then runs the same wrapper and
`horovodrun ... hvdcls train` as the host-list executor (or `mpirun`, SlurmOptions.launcher). An
elastic job (`Elastic`) asks for max_np tasks with `--no-kill` and runs horovodrun elastic on
what is left of its allocation (slurm_elastic). Slurm owns the queue; the service only maps
states:

    PENDING, CONFIGURING, REQUEUED, ...      queued
    RUNNING, COMPLETING, SUSPENDED            running
    COMPLETED                                 succeeded
    CANCELLED                                 cancelled
    FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...   failed (the Slurm state in the message)

No slurmdbd is assumed, so no sacct: one `squeue --states=all -j ID,ID,...` per turn of the
service's loop asks about every job it follows; Slurm answers until MinJobAge after a job's end,
later the wrapper's exit_status.json in the run directory tells how it ended.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hvdcls.errors import UserError
from hvdcls.launching import launch
from hvdcls.serve import runner
from hvdcls.serve.errors import Rejected
from hvdcls.serve.executors import slurm_elastic
from hvdcls.serve.slurm_options import SlurmOptions
from hvdcls.serve.store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED

BATCH_SCRIPT = "job.sbatch"
QUEUED_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD",
                 "RESIZING", "SPECIAL_EXIT"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED"}
TIMEOUT_SECONDS = 30  # a Slurm command that takes longer means the controller is unreachable


@dataclass(frozen=True)
class Status:
    state: str  # the service's
    slurm_state: str
    exit_code: Optional[int]  # of the batch script; None while it runs
    signal: int = 0
    reason: Optional[str] = None  # why it waits (Resources, Priority, PartitionNodeLimit, ...)


def directives(job_name: str, np: int, run_dir: Path, options: SlurmOptions, elastic: bool = False) -> list[str]:
    lines = [f"--job-name={job_name}", f"--ntasks={np}", "--cpus-per-task=1",
             f"--output={run_dir / runner.STDOUT}", f"--error={run_dir / runner.STDERR}", f"--chdir={run_dir}"]
    if options.tasks_per_node:
        lines += [f"--nodes={-(-np // options.tasks_per_node)}", f"--ntasks-per-node={options.tasks_per_node}"]
    if elastic:  # a node that fails leaves the job running on the others (slurm_elastic)
        lines.append("--no-kill")
    return lines + options.directives()


@dataclass(frozen=True)
class Elastic:
    """An elastic job's bounds: it asks Slurm for max_np tasks and runs on what is left of them."""

    min_np: int
    max_np: int
    network_interface: Optional[str] = None  # horovodrun's, when the job may run on one node


def batch_script(job_name: str, np: int, backend: str, run_dir: Path, options: SlurmOptions,
                 elastic: Optional[Elastic] = None, launch_id: Optional[str] = None) -> str:
    """The sbatch script: hosts and slots from the allocation, then the wrapper (claiming the
    launch `launch_id`) around `horovodrun --gloo -np N -H HOSTS ... hvdcls train --config
    RUN_DIR/job.yaml`; an elastic job's horovodrun takes its hosts from RUN_DIR/discover.sh
    instead (slurm_elastic)."""
    train = runner.train_command(run_dir, backend)
    ask_hosts = [sys.executable, "-m", "hvdcls.serve.executors.slurm_batch", "hosts", str(run_dir)]
    if elastic:
        launcher = slurm_elastic.horovodrun(np, elastic.min_np, elastic.max_np, run_dir, train,
                                            elastic.network_interface)
        words = [shlex.quote(part) for part in runner.wrapped(run_dir, launcher, launch_id)]
        find_hosts = " ".join(map(shlex.quote, [*ask_hosts, "--elastic"])) + " >/dev/null"
    else:
        job = runner.wrapped(run_dir, launcher_command(options, np, train), launch_id)
        words = [shlex.quote(part) for part in job]
        words[job.index("-H") + 1] = '"$hosts"'  # known only inside the allocation
        find_hosts = f"hosts=$({' '.join(map(shlex.quote, ask_hosts))})"
    tasks = elastic.max_np if elastic else np
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {line}" for line in directives(job_name, tasks, run_dir, options,
                                                                                 elastic is not None)),
                      "# Written by hvdcls serve (docs/serve.md); the same job by hand: sbatch this file.",
                      "set -euo pipefail", find_hosts, f"exec {' '.join(words)}", ""])


def launcher_command(options: SlurmOptions, np: int, train: list[str]) -> list[str]:
    """horovodrun (Gloo) or mpirun, with the placeholder host HOSTS for -H. mpirun starts its
    daemons over ssh (`-mca plm rsh`), as horovodrun does, rather than through srun: the job's
    ranks are not Slurm tasks either way."""
    hosts = {"HOSTS": np}
    if options.launcher == "mpirun":
        command = launch.mpirun(np, train, hosts=hosts, env=launch.single_host_env())
        return [*command[:1], "-mca", "plm", "rsh", *command[1:]]
    return launch.horovodrun(np, train, hosts=hosts)


def tasks_per_node(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE, e.g. '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in filter(None, text.split(",")):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not found:
            raise UserError(f"SLURM_TASKS_PER_NODE {text!r}: cannot read {item!r} (expected N or N(xM))")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def allocation(hostnames: list[str], tasks: str) -> dict[str, int]:
    """Horovod's hosts for this allocation: each node with its number of tasks."""
    counts = tasks_per_node(tasks)
    if len(counts) != len(hostnames):
        raise UserError(f"{len(hostnames)} nodes but SLURM_TASKS_PER_NODE {tasks!r} counts {len(counts)}")
    return dict(zip(hostnames, counts))


# squeue --Format: "|" after each field (Reason may hold spaces, never "|"); exit_code is the
# batch script's wait status (exit status << 8 | signal).
SQUEUE_FORMAT = "JobID:|,State:|,Reason:|,exit_code:|"


def status(slurm_state: str, reason: Optional[str] = None, wait_status: int = 0) -> Status:
    code, sig = wait_status >> 8, wait_status & 0x7F
    reason = reason if reason not in (None, "", "None") else None
    if slurm_state in QUEUED_STATES:
        return Status(QUEUED, slurm_state, None, reason=reason)
    if slurm_state in RUNNING_STATES:
        return Status(RUNNING, slurm_state, None)
    state = {"COMPLETED": SUCCEEDED, "CANCELLED": CANCELLED}.get(slurm_state, FAILED)
    return Status(state, slurm_state, code, sig, reason)


def parse_squeue(text: str) -> dict[str, Status]:
    """`squeue -h -O SQUEUE_FORMAT` lines -> each job's status by its id."""
    found = {}
    for line in filter(None, (line.strip() for line in text.splitlines())):
        job_id, slurm_state, reason, wait_status = line.split("|")[:4]
        # "CANCELLED by 1000" in some versions' long form: the state is the first word.
        found[job_id] = status(slurm_state.split()[0], reason, int(wait_status or 0))
    return found


def call(args: list[str], env: Optional[dict] = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, env=env)
    except FileNotFoundError:
        raise UserError(f"{args[0]}: not found; --executor slurm needs Slurm's client commands on PATH") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{args[0]}: no answer in {TIMEOUT_SECONDS} s (is slurmctld up?)") from None


def one_line(stderr: str) -> str:
    """sbatch's reason, without the repeated `sbatch: error:` prefixes."""
    lines = [line.split("error: ", 1)[-1].strip() for line in stderr.splitlines() if line.strip()]
    return "; ".join(dict.fromkeys(lines)) or "no reason given"


def submit(script: Path, env: Optional[dict] = None) -> str:
    """The Slurm job id; Rejected (one line) when sbatch refuses the job."""
    done = call(["sbatch", "--parsable", str(script)], env)
    if done.returncode != 0:
        raise Rejected(f"Slurm refused the job: {one_line(done.stderr)}")
    return done.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER"


def query(slurm_ids: list[str]) -> dict[str, Status]:
    """Every job's status in one squeue call; a job Slurm no longer knows (ended more than
    MinJobAge ago) is missing from the answer."""
    if not slurm_ids:
        return {}
    done = call(["squeue", "--noheader", "--states=all", f"--jobs={','.join(slurm_ids)}",
                 f"--Format={SQUEUE_FORMAT}"])
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # squeue's answer when it knows none of them
            return {}
        raise UserError(f"squeue: {one_line(done.stderr)}")
    return parse_squeue(done.stdout)


def find(job_name: str) -> dict[str, Status]:
    """The jobs Slurm knows by this name (pending, running, or ended within MinJobAge)."""
    done = call(["squeue", "--noheader", "--states=all", f"--name={job_name}", f"--Format={SQUEUE_FORMAT}"])
    if done.returncode != 0:
        raise UserError(f"squeue: {one_line(done.stderr)}")
    return parse_squeue(done.stdout)


def cancel(slurm_id: str) -> None:
    call(["scancel", slurm_id])


def main(argv: list[str]) -> int:
    """`python -m hvdcls.serve.executors.slurm_batch hosts RUN_DIR [--elastic]`, inside the batch job: print
    horovodrun's -H for this allocation and write it to RUN_DIR/allocation (what the service
    shows); --elastic: also the nodes and the discovery script of slurm_elastic."""
    import os

    usage = "usage: python -m hvdcls.serve.executors.slurm_batch hosts RUN_DIR [--elastic]"
    assert argv[:1] == ["hosts"] and len(argv) in (2, 3) and argv[2:] in ([], ["--elastic"]), usage
    names = call(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]).stdout.split()
    hosts = allocation(names, os.environ["SLURM_TASKS_PER_NODE"])
    run_dir = Path(argv[1])
    runner.write_allocation(run_dir, hosts)
    if argv[2:] == ["--elastic"]:
        slurm_elastic.write_discovery(run_dir, hosts)
    print(launch.hosts_arg(hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
