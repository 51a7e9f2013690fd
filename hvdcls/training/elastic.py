"""Elastic training: the shared epoch loop under Horovod's elastic mode, for every backend.

    horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh \\
        --blacklist-cooldown-range 2 10 hvdcls train --backend torch training.elastic=true

The backend's elastic state (hvdcls.backend.Backend.elastic_state) holds the model, the
optimizer and the progress below; it is committed every training.commit_every steps and at
every epoch end. When a worker dies, the survivors roll back to the last commit; when hosts
come or go, every worker re-synchronises from rank 0. Either way the attempt below starts
again with the new world: the rest of the epoch's permutation is dealt over it (see
hvdcls.data.sharding.ElasticShards) and the learning rate is scaled for its size. Under
training.balance=dynamic each attempt plans afresh from equal batches for its world, with a
new speed meter (ranks may be renumbered, replaced or new: no earlier measurement is theirs),
and the plans in force are kept in the state, for summary.json (docs/balancing.md).

The steps and the epoch's end are the plain run's (hvdcls.training.loop.Trainer.run_steps and
end_epoch), with the plain run's callbacks (hvdcls.training.callbacks); what elastic adds around
each step, `Commits`, is one more callback on that list for the epoch's steps.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from hvdcls.backend import Backend, Context, share_cores
from hvdcls.config import Config
from hvdcls.data.sharding import ElasticShards
from hvdcls.data.sources import Data
from hvdcls.errors import UserError
from hvdcls.files import status_file
from hvdcls.observe.monitor import EpochRecord, Monitor, Sink, StepSample
from hvdcls.training import callbacks
from hvdcls.training.callbacks import Callback, Rebalancing
from hvdcls.training.faults import StepHooks
from hvdcls.training.loop import Trainer, shifted, world_hosts
from hvdcls.training.outputs import RunOutputs
from hvdcls.training.tallies import EpochTimes, Reduced, Tally, as_floats
from hvdcls.training.watchdog import COMMITTING, RESETTING, Phases, Watchdog


def initial_progress(start_epoch: int, history: list[EpochRecord]) -> dict:
    """What the elastic state carries besides model and optimizer (rank 0's wins on sync)."""
    return {"epoch": start_epoch, "consumed": 0, "global_step": 0, "epoch_steps": 0,
            "train_sums": [0.0, 0.0, 0.0], "train_seconds": 0.0, "lr": 0.0,
            "history": list(history), "balance_plans": []}


def attempt_seed(seed: int, epoch: int, rank: int, consumed: int) -> int:
    """Framework RNG seed for one rank from one point of an epoch: a restart draws afresh."""
    return int(np.random.SeedSequence([seed, epoch, rank, consumed]).generate_state(1)[0])


def schedule_position(epoch: int, consumed: int, shards: ElasticShards) -> float:
    """Where the learning-rate schedule stands, counted in steps of the world as it is now:
    the same fraction of the run whatever world trained before."""
    return epoch * shards.steps_per_epoch + consumed / shards.per_step


@dataclass
class Recoveries:
    """This process's view of the resets: for the summary (rank 0 writes it)."""

    steps_run: int = 0  # steps this process trained, rolled-back ones included
    last_step_end: Optional[float] = None
    attempts: int = 0
    events: list = field(default_factory=list)

    def restarted(self, state, ctx: Context) -> None:
        self.attempts += 1
        if self.attempts > 1:
            self.events.append({"world_size": ctx.size, "resumed_at_step": state.global_step,
                                "epoch": state.epoch + 1, "seconds": None})

    def step_started(self) -> None:
        """The first step after a reset closes the gap since the last step before it."""
        if self.events and self.events[-1]["seconds"] is None and self.last_step_end is not None:
            self.events[-1]["seconds"] = round(time.perf_counter() - self.last_step_end, 3)

    def step_done(self) -> None:
        self.steps_run += 1
        self.last_step_end = time.perf_counter()

    def summary(self, state, commit_every: int) -> dict:
        return {"commit_every": commit_every, "resets": len(self.events), "recoveries": self.events,
                "steps_run": self.steps_run, "steps_kept": state.global_step,
                "steps_lost": max(0, self.steps_run - state.global_step)}


class Commits(Callback):
    """Elastic's part of each step of an attempt's epoch (hvdcls.training.loop.Trainer.run_steps):
    recovery accounting, the test kill hook, and every training.commit_every steps the steps
    since the last commit folded into the state and committed."""

    def __init__(self, state, backend: Backend, rank: int, per_step: int, commit_every: int,
                 recoveries: Recoveries, phases: Optional[Phases] = None,
                 hooks: Optional[StepHooks] = None):
        self.state, self.backend, self.rank, self.per_step = state, backend, rank, per_step
        self.commit_every, self.recoveries, self.phases = commit_every, recoveries, phases or Phases()
        self.hooks = hooks or StepHooks(rank)  # the test kill hook (the trainer's, read once)
        # Steps since the last commit: counted here, not from the tally, which a re-plan's
        # new stretch of steps starts afresh (training.balance) while the commit clock runs on.
        self.uncommitted = 0

    def before_step(self, trainer: callbacks.Trainer, epoch: int, step: int) -> None:
        self.recoveries.step_started()

    def after_step(self, trainer: callbacks.Trainer, tally: Tally, sample: StepSample) -> bool:
        self.recoveries.step_done()
        self.hooks.kill_point(self.state.global_step + tally.steps)  # inert outside tests
        self.uncommitted += 1
        if self.uncommitted == self.commit_every:
            self.phases.enter(COMMITTING)
            self.fold(tally)
            self.uncommitted = 0
            self.state.commit()  # Horovod: a snapshot to roll back to; raises on host changes
            tally.restart()
        return False

    def fold(self, tally: Tally) -> None:
        """The steps since the last commit, into the state (every rank alike: a collective)."""
        state = self.state
        name = f"elastic_sums.{state.global_step}"
        reduced = self.backend.allreduce_sum(as_floats(tally.total), name)
        state.train_sums = [a + b for a, b in zip(state.train_sums, reduced)]
        state.consumed += tally.steps * self.per_step
        state.global_step += tally.steps
        state.epoch_steps += tally.steps
        state.train_seconds += tally.seconds()
        state.lr = tally.lr


class RankZeroWatchers:
    """Rank 0's watchers (progress lines, the metrics port, TensorBoard, report.png) follow
    rank 0 across resets: after each sync, the process that became rank 0 makes them (the same
    configured port, on its own host) and one that stopped being rank 0 closes its own. Without
    this a job whose first rank 0 left trains on silently, and `hvdcls serve` ends it as hung.

    `make(metrics)` makes the sinks, the Prometheus one only if `metrics`; it raises UserError
    when the port is busy. The last holder on this host may still be closing it (it closes
    after the same sync), so the port is tried for `port_wait_seconds` before going on
    without it: progress lines matter more than the endpoint."""

    def __init__(self, monitor: Monitor, make: Callable[[bool], list[Sink]],
                 say: Callable[[str], None] = lambda line: print(line, flush=True),
                 port_wait_seconds: float = 10.0, sleep: Callable[[float], None] = time.sleep):
        self.monitor, self.make, self.say = monitor, make, say
        self.port_wait_seconds, self.sleep = port_wait_seconds, sleep
        self.held = bool(monitor.sinks)  # the first rank 0 made them before the loop

    def follow(self, ctx: Context) -> None:
        if ctx.is_main and not self.held:
            self.monitor.sinks = self.take_over()
            self.held = True
            self.say(f"elastic: rank 0 is now this process on {socket.gethostname()}: "
                     f"it took over the watchers ({ctx.size} worker(s))")
        elif not ctx.is_main and self.held:
            self.monitor.close()  # frees the metrics port for the new rank 0
            self.monitor.sinks = []
            self.held = False
            self.say(f"elastic: this process is rank {ctx.rank} now: it closed rank 0's watchers")

    def take_over(self) -> list[Sink]:
        waited = 0.0
        while True:
            try:
                return self.make(True)
            except UserError as err:
                if waited >= self.port_wait_seconds:
                    self.say(f"elastic: {err}; the new rank 0 goes on without the metrics endpoint")
                    return self.make(False)
            self.sleep(0.25)
            waited += 0.25


class ElasticTrainer:
    """One attempt per (re)start of the world; everything lasting lives in `state`."""

    def __init__(self, config: Config, backend: Backend, data: Data, run_dir: Path,
                 monitor: Monitor, watchdog: Watchdog,
                 make_outputs: Callable[[Path, bool], RunOutputs] = RunOutputs,
                 watchers: Optional[RankZeroWatchers] = None,
                 stop_writer: Optional[Callable[[RunOutputs, Context], Callable[[dict], None]]] = None):
        self.config, self.backend, self.data, self.run_dir = config, backend, data, run_dir
        self.monitor, self.watchdog, self.make_outputs = monitor, watchdog, make_outputs
        self.watchers = watchers
        self.stop_writer = stop_writer
        self.recoveries = Recoveries()

    def attempt(self, state, ctx: Context) -> Trainer:
        """Train from the state's point to the end, in the world as it is now. Leaving it for
        a reset, the watchdog lets Horovod take its time (its --elastic-timeout bounds it)."""
        self.watchdog.rank = ctx.rank
        self.watchdog.phases.restart()
        try:
            # Heartbeats to this world's rank 0 (another process, maybe, and another size).
            self.watchdog.rewire(ctx.rank, ctx.size,
                                 lambda address: self.backend.broadcast_object(address, "heartbeat"))
            return self.attempt_here(state, ctx)
        except BaseException:
            self.watchdog.phases.enter(RESETTING)
            self.monitor.phase(status_file.RESETTING)  # rank 0's status.json, until a new world steps
            raise

    def attempt_here(self, state, ctx: Context) -> Trainer:
        ctx = share_cores(self.backend, ctx, self.config)
        self.recoveries.restarted(state, ctx)
        if self.watchers is not None:  # before trainer.begin, which starts the sinks
            self.watchers.follow(ctx)
        outputs = self.make_outputs(self.run_dir, ctx.is_main)
        if self.stop_writer is not None:  # a stall's summary.json comes from this world's rank 0
            self.watchdog.last_record = self.stop_writer(outputs, ctx)
        trainer = Trainer(self.config, self.backend, ctx, self.data, outputs, self.monitor,
                          self.watchdog.phases, start_step=state.global_step)
        if self.recoveries.attempts > 1:
            outputs.say(f"elastic: {ctx.size} worker(s), resuming epoch {state.epoch + 1} after "
                        f"{state.consumed} of its samples (global step {state.global_step})")
        trainer.begin(state.epoch, state.history, world_hosts(self.backend, ctx))
        record_plan(state, trainer)
        while state.epoch < self.config.training.epochs:
            times = self.train_rest_of_epoch(state, trainer)
            self.finish_epoch(state, trainer, times)
        return trainer

    def train_rest_of_epoch(self, state, trainer: Trainer) -> EpochTimes:
        """The epoch's steps from the state's point on, dealt over this world; the last ones
        since a commit are folded into the state, left for the epoch's end to commit. Under
        training.balance, one stretch of steps per plan in force: a new plan (at the same step
        boundary on every rank) cuts the rest of the epoch anew from the samples consumed."""
        ctx, epoch = trainer.ctx, state.epoch
        # The trainer's: the shards its step count (schedule, EMA, progress) is taken from.
        shards = trainer.elastic_shards
        assert shards is not None, "an elastic attempt's trainer is built with training.elastic=true"
        self.backend.seed(attempt_seed(self.config.training.seed, epoch, ctx.rank, state.consumed))
        # Horovod: the rate follows the world as it is now (peak x size, this size's steps).
        lr_at = trainer.lr_at
        commits = Commits(state, self.backend, ctx.rank, shards.per_step,
                          self.config.training.commit_every, self.recoveries, trainer.phases,
                          trainer.faults)
        times = EpochTimes()  # no bytes per step: an attempt sees only part of the epoch
        trainer.callbacks.epoch_begin(trainer, epoch)
        trainer.callbacks.insert_before(Rebalancing, commits)
        try:
            while True:
                consumed = state.consumed
                first = int(consumed / shards.per_step)  # this world's steps already done this epoch
                position = schedule_position(epoch, consumed, shards)
                trainer.step_origin = state.global_step - first
                batches = trainer.epoch_batches(epoch, rest_of_epoch(shards, trainer, epoch, consumed))
                tally = trainer.run_steps(epoch, batches, first, shifted(lr_at, position), times)
                if tally.steps:
                    commits.fold(tally)
                record_plan(state, trainer)
                if trainer.rebalancer is None or state.consumed == consumed or \
                        not shards.remaining_steps(state.consumed):
                    return times
        finally:
            trainer.callbacks.remove(commits)

    def finish_epoch(self, state, trainer: Trainer, times: EpochTimes) -> None:
        """Evaluate and record the epoch, then start the next one in the state and commit."""
        seconds = max(state.train_seconds, 1e-9)
        record = trainer.end_epoch(state.epoch, Reduced.from_sums(state.train_sums), state.lr,
                                   seconds, times, state.epoch_steps, started=None)
        state.history = state.history + [record]  # a new list: the saved snapshot keeps the old
        state.epoch, state.consumed, state.epoch_steps = state.epoch + 1, 0, 0
        state.train_sums, state.train_seconds = [0.0, 0.0, 0.0], 0.0
        trainer.phases.enter(COMMITTING)
        state.commit()


def rest_of_epoch(shards: ElasticShards, trainer: Trainer, epoch: int, consumed: int) -> list:
    """This rank's micro-batches for the rest of the epoch: dealt round-robin, or cut at the
    offsets of the trainer's plan in force (training.balance)."""
    if trainer.rebalancer is None:
        return shards.batches(epoch, consumed)
    return shards.balanced_batches(epoch, consumed, trainer.rebalancer.plan.batches)


def record_plan(state, trainer: Trainer) -> None:
    """The trainer's plan in force, appended to the state's plans unless it is the last one
    there: committed with the steps it served, rolled back with them."""
    if trainer.rebalancer is None:
        return
    plan = trainer.rebalancer.plan.as_dict()
    if not state.balance_plans or state.balance_plans[-1] != plan:
        state.balance_plans = state.balance_plans + [plan]  # a new list: the snapshot keeps the old


def balance_summary(trainer: Trainer, state) -> Optional[dict]:
    """summary.json's `balance`: the last attempt's plan and speeds, every world's plans."""
    if trainer.rebalancer is None:
        return None
    return {**trainer.rebalancer.balancer.summary(), "plans": list(state.balance_plans)}


def run(config: Config, backend: Backend, data: Data, run_dir: Path, monitor: Monitor,
        start_epoch: int, history: list[EpochRecord], watchdog: Watchdog,
        make_sinks: Optional[Callable[[bool], list[Sink]]] = None,
        stop_writer: Optional[Callable[[RunOutputs, Context], Callable[[dict], None]]] = None,
        ) -> tuple[Trainer, Any, dict]:
    """Train under Horovod's elastic retry; returns (the last attempt's trainer, the state,
    what the resets cost as this process saw them). With `make_sinks` (RankZeroWatchers), the
    monitor's sinks follow rank 0; with `stop_writer`, so does the watchdog's last record."""
    watchers = RankZeroWatchers(monitor, make_sinks) if make_sinks is not None else None
    elastic = ElasticTrainer(config, backend, data, run_dir, monitor, watchdog, watchers=watchers,
                             stop_writer=stop_writer)
    state = backend.elastic_state(initial_progress(start_epoch, history))
    trainer = backend.elastic_run(state, elastic.attempt)
    return trainer, state, elastic.recoveries.summary(state, config.training.commit_every)
