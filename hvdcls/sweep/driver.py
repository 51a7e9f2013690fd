"""The sweep's loop: keep at most K trials' jobs in the service, feed the searcher each epoch
they finish, cancel the ones it prunes, close each as done, pruned or failed.

Everything the sweep knows lives in its Optuna study (DIR/study.db): each trial's values
(user attribute `params`), its job (`job_id`), its epochs (Optuna's intermediate values) and
state. So a sweep that was interrupted picks up where it was: the trials still running are
followed again through their jobs (which the service kept running), and new ones are asked
for until N trials are accounted for.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from hvdcls.errors import UserError
from hvdcls.sweep import searcher, trials
from hvdcls.sweep.jobs import Jobs
from hvdcls.sweep.space import Parameter

REFUSED = "refused"  # a trial's user attribute: the service refused the sweep's first job


@dataclass(frozen=True)
class Limits:
    trials: int
    parallel: int
    metric: str = "val_accuracy"
    grid: bool = False
    poll_seconds: float = 1.0


@dataclass
class Running:
    number: int
    trial: Any  # optuna.Trial
    job_id: int
    epochs: int  # its config's: the last epoch is never pruned (nothing left to save)
    reported: set[int] = field(default_factory=set)
    judged_with: int = 0  # trials done when the pruner last looked at it


class Driver:
    def __init__(self, study, space: Sequence[Parameter], plan: trials.Plan, jobs: Jobs, limits: Limits,
                 say: Callable[[str], None] = print, changed: Callable[[], None] = lambda: None,
                 closed: Callable[[int, str, Optional[float]], None] = lambda number, state, value: None,
                 sleep: Callable[[float], None] = time.sleep):
        self.study, self.space, self.plan, self.jobs, self.limits = study, space, plan, jobs, limits
        self.say, self.changed, self.closed, self.sleep = say, changed, closed, sleep
        self.active: dict[int, Running] = {}
        self.submitted = 0  # by this process: the first refusal of all is the sweep's, not a trial's
        self.done = 0  # trials closed as done by this process: each may change the pruner's mind

    def run(self) -> None:
        """Until `limits.trials` trials are accounted for and none is running."""
        self.resume()
        while True:
            while len(self.active) < self.limits.parallel and self.counted() < self.limits.trials:
                self.start()
            if not self.active:
                return
            self.sleep(self.limits.poll_seconds)
            for running in list(self.active.values()):
                self.follow(running)

    def resume(self) -> None:
        """Follow again the trials an earlier run left running; close those that never got a job."""
        for frozen in self.study.get_trials(deepcopy=False):
            if searcher.state_of(frozen) != "running":
                continue
            job_id = frozen.user_attrs.get("job_id")
            trial = searcher.attach(self.study, frozen.number)
            if job_id is None:
                self.close(trial, "failed", message="interrupted before its job was submitted")
                continue
            epochs = trials.config(self.plan, frozen.user_attrs.get("params", {})).training.epochs
            self.active[frozen.number] = Running(frozen.number, trial, int(job_id), epochs,
                                                 set(frozen.intermediate_values))
            self.say(f"trial {frozen.number}: following job {job_id} again")

    def start(self) -> None:
        trial = self.study.ask()
        params = searcher.suggest(trial, self.space, self.limits.grid)
        trial.set_user_attr("params", params)
        try:
            epochs = trials.config(self.plan, params).training.epochs
        except UserError as err:  # these values make a config that cannot train: no job for it
            self.close(trial, "failed", message=str(err))
            return
        try:
            job_id = self.jobs.submit(trials.job_spec(self.plan, trial.number, params))
        except UserError as err:
            if self.submitted == 0 and not self.finished_any():
                trial.set_user_attr(REFUSED, str(err))  # not one of the N: the sweep stops here
                searcher.finish(self.study, trial.number, "failed")
                raise  # the first submission refused: the sweep's settings, not this trial's values
            self.close(trial, "failed", message=str(err))
            return
        self.submitted += 1
        trial.set_user_attr("job_id", job_id)
        self.active[trial.number] = Running(trial.number, trial, job_id, epochs)
        self.say(f"trial {trial.number}: job {job_id}, {shown(params)}")
        self.changed()

    def counted(self) -> int:
        return sum(REFUSED not in t.user_attrs for t in self.study.get_trials(deepcopy=False))

    def finished_any(self) -> bool:
        return any(searcher.state_of(t) == "done" for t in self.study.get_trials(deepcopy=False))

    def follow(self, running: Running) -> None:
        job = self.jobs.poll(running.job_id)
        found = trials.values(job.records, self.limits.metric)
        for epoch in sorted(set(found) - running.reported):
            running.reported.add(epoch)
            running.judged_with = self.done
            prune = searcher.report(running.trial, epoch, found[epoch])
            self.changed()
            if prune and job.state != "succeeded" and epoch < running.epochs:
                self.prune(running, epoch, found[epoch])
                return
        if job.final:
            self.end(running, job, found)
        elif self.judged_again(running):
            last = max(running.reported)
            self.prune(running, last, found.get(last, float("nan")))

    def judged_again(self, running: Running) -> bool:
        """Has a trial finished since the pruner last saw this one's epoch, and does it now say
        stop? Without this a trial whose epoch came before the last finished trial it is judged
        against (the pruner's `prune_after`) would run to its end, as would one whose next epoch
        is slower than the others' whole runs."""
        if running.judged_with == self.done or not running.reported or max(running.reported) >= running.epochs:
            return False
        running.judged_with = self.done
        return searcher.should_prune(running.trial)

    def prune(self, running: Running, epoch: int, value: float) -> None:
        self.jobs.cancel(running.job_id)  # its slots go to the next trial now
        self.close(running.trial, "pruned", epoch=epoch, value=value)

    def end(self, running: Running, job: trials.JobView, found: dict[int, float]) -> None:
        if job.state == "succeeded" and found:
            last = max(found)
            self.close(running.trial, "done", epoch=last, value=found[last])
        elif job.state == "succeeded":
            self.close(running.trial, "failed", message=f"its job succeeded but recorded no {self.limits.metric}")
        elif job.state == "cancelled":
            self.close(running.trial, "failed", message="its job was cancelled through the service")
        else:
            self.close(running.trial, "failed", message=job.message or "its job failed")

    def close(self, trial, state: str, epoch: Optional[int] = None, value: Optional[float] = None,
              message: Optional[str] = None) -> None:
        number = trial.number
        if message:
            trial.set_user_attr("message", message.splitlines()[0][:500])
        searcher.finish(self.study, number, state, value)
        self.active.pop(number, None)
        self.done += state == "done"
        at = f" at epoch {epoch} ({self.limits.metric} {value:.4f})" if epoch is not None and value is not None else ""
        why = f": {message.splitlines()[0]}" if message else ""
        self.say(f"trial {number}: {state}{at}{why}")
        self.closed(number, state, value)
        self.changed()


def shown(params: dict) -> str:
    return " ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                    for key, value in params.items())
