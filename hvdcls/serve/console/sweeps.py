"""What the console's sweep pages show: the jobs whose spec carries a sweep tag (JobSpec.sweep,
set by `hvdcls sweep`), grouped by the tag's id, each job one trial.

A trial's state is told in the sweep's words, from its job's: done (succeeded, with the
sweep's metric), pruned (cancelled by its sweep: `cancel?reason=pruned`), failed (failed,
cancelled by a person, or succeeded without the metric: as the sweep counts them), running,
queued. Its value is the metric at its last epoch that has one (metrics.jsonl); the sweep's
best is its best done trial, as `hvdcls sweep` picks it. An ended job's metric never changes,
so it is read once (Metrics); a running one's at each look.
"""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, cast

from hvdcls.files import fileio
from hvdcls.serve.store import CANCELLED, FAILED, FINAL, PRUNED, SUCCEEDED, Job, Store

PAGE = 50  # sweeps per page of the list
DONE = "done"
STATES = (DONE, PRUNED, FAILED, "running", "queued")  # the sweep's words, in the list's column order
METRICS_FILE = "metrics.jsonl"
CACHED = 100_000  # ended jobs' metrics held at most (beyond this the cache starts again)


@dataclass
class Trial:
    number: int
    job: Job
    params: dict
    state: str
    epoch: Optional[int]  # the last epoch with the metric
    value: Optional[float]  # the metric there
    note: str = ""  # why it failed, where it was pruned


@dataclass
class Sweep:
    id: str
    name: str
    owner: Optional[str]
    metric: str
    direction: str
    planned: Optional[int]  # the trials it asks for (the largest any of its jobs says)
    trials: list[Trial] = field(default_factory=list)  # by number, then job

    @property
    def counts(self) -> dict[str, int]:
        return {state: sum(t.state == state for t in self.trials) for state in STATES}

    @property
    def started(self) -> Optional[float]:
        return min((t.job.submitted_at for t in self.trials), default=None)

    @property
    def best(self) -> Optional[Trial]:
        done = [t for t in self.trials if t.state == DONE and t.value is not None]
        pick = max if self.direction == "maximize" else min
        return pick(done, key=lambda t: cast(float, t.value)) if done else None

    def chart(self) -> dict:
        """uPlot's columns: trial numbers, best so far, each done trial's value, each pruned one's
        value where it stopped (None where a series has no point)."""
        numbers, best, done, pruned = [], [], [], []
        top: Optional[float] = None
        better = (lambda a, b: a > b) if self.direction == "maximize" else (lambda a, b: a < b)
        for trial in sorted(self.trials, key=lambda t: t.number):
            if trial.state == DONE and trial.value is not None and (top is None or better(trial.value, top)):
                top = trial.value
            numbers.append(trial.number)
            best.append(top)
            done.append(trial.value if trial.state == DONE else None)
            pruned.append(trial.value if trial.state == PRUNED else None)
        return {"numbers": numbers, "best": best, "done": done, "pruned": pruned}


class Metrics:
    """(epoch, value) of a job's last epoch with a metric, read from its metrics.jsonl; kept
    for jobs that have ended (their file no longer changes)."""

    def __init__(self, limit: int = CACHED):
        self.ended: dict[tuple[int, str], tuple[Optional[int], Optional[float]]] = {}
        self.limit, self.lock = limit, threading.Lock()

    def last(self, job: Job, metric: str) -> tuple[Optional[int], Optional[float]]:
        key = (job.id, metric)
        with self.lock:
            if key in self.ended:
                return self.ended[key]
        found = last_value(job.run_dir, metric)
        if job.state in FINAL:
            with self.lock:
                if len(self.ended) >= self.limit:
                    self.ended.clear()
                self.ended[key] = found
        return found


def last_value(run_dir: Optional[str], metric: str) -> tuple[Optional[int], Optional[float]]:
    if not run_dir:
        return None, None
    try:
        records = fileio.read_jsonl(Path(run_dir) / METRICS_FILE)
    except (OSError, ValueError):  # none yet, or damaged: no value rather than a 500
        return None, None
    for record in reversed(records):
        value = record.get(metric) if isinstance(record, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return record.get("epoch"), float(value)
    return None, None


def tag_of(job: Job) -> dict:
    return json.loads(job.spec).get("sweep") or {}


def trial_state(job: Job, value: Optional[float], metric: str) -> tuple[str, str]:
    """(the trial's state in the sweep's words, a note saying why where it is not plain)."""
    if job.cancel_reason == PRUNED:  # pruned from the sweep's decision on, while its job stops
        return PRUNED, ""
    if job.state == SUCCEEDED:
        return (DONE, "") if value is not None else (FAILED, f"its job succeeded but recorded no {metric}")
    if job.state == CANCELLED:
        return FAILED, "its job was cancelled through the service"
    if job.state == FAILED:
        return FAILED, (job.message or "its job failed").splitlines()[0][:300]
    return job.state, ""


def gather(jobs: list[Job], metrics: Metrics) -> list[Sweep]:
    """The sweeps these jobs make, in the order of their first job."""
    found: dict[str, Sweep] = {}
    for job in jobs:
        tag = tag_of(job)
        sweep = found.get(str(job.sweep_id))
        if sweep is None:
            sweep = found[str(job.sweep_id)] = Sweep(str(job.sweep_id), tag.get("name") or str(job.sweep_id),
                                                     job.owner, tag.get("metric", "val_accuracy"),
                                                     tag.get("direction", "maximize"), None)
        if tag.get("trials"):
            sweep.planned = max(sweep.planned or 0, int(tag["trials"]))
        epoch, value = metrics.last(job, sweep.metric)
        state, note = trial_state(job, value, sweep.metric)
        if state == PRUNED and epoch is not None:
            note = f"at epoch {epoch}"
        sweep.trials.append(Trial(int(tag.get("trial", 0)), job, tag.get("params") or {}, state, epoch, value, note))
    for sweep in found.values():
        sweep.trials.sort(key=lambda t: (t.number, t.job.id))
    return list(found.values())


def page_of_sweeps(store: Store, metrics: Metrics, page: int) -> tuple[list[Sweep], int]:
    """One page of the sweep list (the one with the newest job first), and how many there are."""
    ids = store.sweep_ids(PAGE, (page - 1) * PAGE)
    by_id = {sweep.id: sweep for sweep in gather(store.sweep_jobs(ids), metrics)} if ids else {}
    return [by_id[i] for i in ids if i in by_id], store.count_sweeps()


def one_sweep(store: Store, metrics: Metrics, sweep_id: str) -> Optional[Sweep]:
    found = gather(store.sweep_jobs([sweep_id]), metrics)
    return found[0] if found else None

