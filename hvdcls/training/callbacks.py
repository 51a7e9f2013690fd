"""The Trainer's add-ons, as callbacks on one hook list beside the loop.

The step loop (hvdcls.training.loop.Trainer.run_steps) and the epoch's end (end_epoch) read as a
loop: read the batches, step, count, evaluate, record. Whatever a run adds around them is a
`Callback` in the trainer's `Callbacks`, built once from the config (`for_run`): the test fault
hooks, the profiler, the model EMA, fine-tuning's frozen epochs, dynamic batch balancing, the
target-accuracy stop, the checkpoint cadence and `data.workers=auto`'s choice. An elastic
attempt (hvdcls.training.elastic) drives the same loop with the same list, and adds its commits
to it (`Commits`, one more callback).

The order of the list is the order of the hooks, and it matters where two add-ons touch the
same step: the EMA folds a step's weights in before elastic's commit snapshots them;
balancing, which may end the stretch of steps, comes after both (elastic inserts its commits
before it); the target stop decides (`validated`, as Lightning's early stop does at
validation's end) before the checkpoint cadence (`epoch_end`) asks whether the epoch is the
run's last.

What stays in the loop: the watchdog's phase marks (hvdcls.training.watchdog.Phases). They are
not an add-on but the loop saying where it is, at points inside the step and the epoch end
that no hook boundary would match; the watchdog that reads them is the add-on, in its own
thread (a run without one gets an inert Phases).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Protocol

from hvdcls import finetune
from hvdcls.backend import Backend, Context
from hvdcls.config import Config
from hvdcls.data.batches import EpochBatches
from hvdcls.data.workers import LoaderWorkers
from hvdcls.observe.monitor import EpochRecord, Monitor, StepSample
from hvdcls.training import balance, checkpoint, ema, faults
from hvdcls.training.outputs import RunOutputs
from hvdcls.training.profiling import StepProfiler
from hvdcls.training.tallies import Reduced, Tally


class Trainer(Protocol):
    """What the callbacks use of hvdcls.training.loop.Trainer (which imports this module)."""

    config: Config
    backend: Backend
    ctx: Context
    monitor: Monitor
    outputs: RunOutputs
    passes: int  # backward passes (micro-batches) per optimizer step
    first_epoch: int
    steps_per_epoch: int
    step_origin: int  # the global step of the epoch's step 0
    stopping: Optional[str]
    workers: LoaderWorkers
    shards: Any  # TrainShards or BalancedShards (hvdcls.data.sharding)
    replicas: int  # what the data is dealt and balanced over (parallel.tensor: np / T; else np)
    faults: faults.StepHooks
    ema: Optional[ema.EmaSchedule]
    rebalancer: Optional[balance.Rebalancer]

    def epoch_batches(self, epoch: int, indices: list) -> EpochBatches: ...

    def evaluate(self) -> Reduced: ...

    def save(self, epochs_done: int) -> None: ...


class Callback:
    """One add-on to the loop; every hook is optional (the default does nothing)."""

    def run_begin(self, trainer: Trainer, start_epoch: int) -> None:
        """The run (or an elastic attempt) starts after `start_epoch` epochs (Trainer.begin)."""

    def epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        """Before the epoch's (or an elastic attempt's rest of the epoch's) first step."""

    def batches(self, trainer: Trainer, batches: EpochBatches, first_step: int,
                first_epoch: bool) -> EpochBatches:
        """The micro-batches a stretch of steps will read, numbered from `first_step`."""
        return batches

    def before_step(self, trainer: Trainer, epoch: int, step: int) -> None:
        """Before step `step` (numbered within the epoch) runs."""

    def after_compute(self, trainer: Trainer, epoch: int, step: int, compute_seconds: float) -> None:
        """Right after the optimizer step, inside the step's timed window (`compute_seconds`:
        its time less the all-reduce wait)."""

    def after_step(self, trainer: Trainer, tally: Tally, sample: StepSample) -> bool:
        """Once the step is counted in `tally` (which a hook may fold and restart). True: the
        batches the loader reads are stale (a new balancing plan); the loop starts anew."""
        return False

    def validations(self, trainer: Trainer) -> dict[str, Reduced]:
        """Extra validations at the epoch's end, by name (the EMA's weights: "ema")."""
        return {}

    def validated(self, trainer: Trainer, epoch: int, record: EpochRecord) -> None:
        """The epoch is validated and recorded: whether it is the run's last is decided here
        (trainer.stopping), before the loop writes the last evaluation."""

    def epoch_end(self, trainer: Trainer, epoch: int, record: EpochRecord) -> None:
        """The epoch's last hook (every rank, collectives allowed: every rank calls it)."""


class Callbacks:
    """The hook list: each hook called on every callback, in order."""

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self.items: list[Callback] = list(callbacks)

    def append(self, callback: Callback) -> None:
        self.items.append(callback)

    def insert_before(self, kind: type, callback: Callback) -> None:
        """`callback` just before the first of `kind`'s, or last when there is none."""
        index = next((i for i, c in enumerate(self.items) if isinstance(c, kind)), len(self.items))
        self.items.insert(index, callback)

    def remove(self, callback: Callback) -> None:
        self.items.remove(callback)

    def run_begin(self, trainer: Trainer, start_epoch: int) -> None:
        for callback in self.items:
            callback.run_begin(trainer, start_epoch)

    def epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        for callback in self.items:
            callback.epoch_begin(trainer, epoch)

    def batches(self, trainer: Trainer, batches: EpochBatches, first_step: int,
                first_epoch: bool) -> EpochBatches:
        for callback in self.items:
            batches = callback.batches(trainer, batches, first_step, first_epoch)
        return batches

    def before_step(self, trainer: Trainer, epoch: int, step: int) -> None:
        for callback in self.items:
            callback.before_step(trainer, epoch, step)

    def after_compute(self, trainer: Trainer, epoch: int, step: int, compute_seconds: float) -> None:
        for callback in self.items:
            callback.after_compute(trainer, epoch, step, compute_seconds)

    def after_step(self, trainer: Trainer, tally: Tally, sample: StepSample) -> bool:
        stale = False
        for callback in self.items:  # every one, even after one said stale
            stale = callback.after_step(trainer, tally, sample) or stale
        return stale

    def validations(self, trainer: Trainer) -> dict[str, Reduced]:
        found: dict[str, Reduced] = {}
        for callback in self.items:
            found.update(callback.validations(trainer))
        return found

    def validated(self, trainer: Trainer, epoch: int, record: EpochRecord) -> None:
        for callback in self.items:
            callback.validated(trainer, epoch, record)

    def epoch_end(self, trainer: Trainer, epoch: int, record: EpochRecord) -> None:
        for callback in self.items:
            callback.epoch_end(trainer, epoch, record)


class FaultHooks(Callback):
    """The test hooks of hvdcls.training.faults (a held read, a frozen rank, a slowed one);
    inert outside tests. Elastic's kill hook is in its commits."""

    def __init__(self, hooks: faults.StepHooks):
        self.hooks = hooks

    def batches(self, trainer: Trainer, batches: EpochBatches, first_step: int,
                first_epoch: bool) -> EpochBatches:
        return self.hooks.stalling(batches, first_step, trainer.passes, first_epoch)

    def before_step(self, trainer: Trainer, epoch: int, step: int) -> None:
        self.hooks.freeze_point(step, epoch == trainer.first_epoch)

    def after_compute(self, trainer: Trainer, epoch: int, step: int, compute_seconds: float) -> None:
        self.hooks.slow_point(compute_seconds)


class Profiling(Callback):
    """training.profile_steps: rank 0 profiles that many steps of the run's first epoch."""

    def __init__(self, wanted: int):
        self.wanted = wanted
        self.profiler: Optional[StepProfiler] = None

    def run_begin(self, trainer: Trainer, start_epoch: int) -> None:
        if trainer.ctx.is_main:
            self.profiler = StepProfiler(trainer.backend.profiler, trainer.outputs.run_dir, start_epoch,
                                         trainer.steps_per_epoch, self.wanted, trainer.monitor.note)

    def before_step(self, trainer: Trainer, epoch: int, step: int) -> None:
        if self.profiler:
            self.profiler.before_step(epoch, step)

    def after_step(self, trainer: Trainer, tally: Tally, sample: StepSample) -> bool:
        if self.profiler:
            self.profiler.after_step(sample.epoch, sample.step)
        return False


class ModelEma(Callback):
    """training.ema_decay: the averaged copy updated on its cadence, and validated at each
    epoch's end beside the weights."""

    def __init__(self, schedule: ema.EmaSchedule):
        self.schedule = schedule

    def after_step(self, trainer: Trainer, tally: Tally, sample: StepSample) -> bool:
        if self.schedule.due(sample.epoch * trainer.steps_per_epoch + sample.step):
            trainer.backend.ema_update(self.schedule.decay_at(sample.epoch))
        return False

    def validations(self, trainer: Trainer) -> dict[str, Reduced]:
        with trainer.backend.ema_weights():
            return {"ema": trainer.evaluate()}


class FrozenEpochs(Callback):
    """training.freeze_epochs (fine-tuning): the head alone first, then everything."""

    def __init__(self, freeze_epochs: int):
        self.freeze_epochs = freeze_epochs

    def epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        trainer.backend.set_frozen(finetune.frozen_at(self.freeze_epochs, epoch))


def describe(plan: balance.Plan, trainer: Trainer) -> str:
    """The plan's line: per rank, or per replica under parallel.tensor."""
    return balance.describe(plan, trainer.replicas, "replica" if trainer.config.parallel.tensor > 1 else "rank")


class Rebalancing(Callback):
    """training.balance=dynamic: each rank's compute counted after every step; when an
    exchange is due every rank's is gathered and maybe a new plan adopted (the same answer on
    every rank), which makes the loader's batches stale."""

    def __init__(self, rebalancer: balance.Rebalancer):
        self.rebalancer = rebalancer

    def run_begin(self, trainer: Trainer, start_epoch: int) -> None:
        plan = self.rebalancer.plan  # resume too: a new run plans afresh
        trainer.monitor.note(describe(plan, trainer))
        trainer.monitor.balance(list(plan.batches), list(plan.speeds or []))

    def after_step(self, trainer: Trainer, tally: Tally, sample: StepSample) -> bool:
        new = self.rebalancer.after_step(
            trainer.passes, sample.seconds, sample.allreduce,
            lambda mine: trainer.backend.allgather_object(mine, "balance.speeds"),
            trainer.step_origin + sample.step + 1)
        if new is None:
            return False
        trainer.monitor.note(describe(new, trainer))
        trainer.monitor.balance(list(new.batches), list(new.speeds or []))
        return True


class TargetStop(Callback):
    """training.target_accuracy: the epoch whose validation accuracy (reduced over the ranks:
    all decide alike) reaches it is the run's last."""

    def __init__(self, target: float):
        self.target = target

    def validated(self, trainer: Trainer, epoch: int, record: EpochRecord) -> None:
        if record.val_accuracy >= self.target:
            trainer.stopping = (f"validation accuracy {record.val_accuracy:.4f} reached "
                                f"training.target_accuracy={self.target:g} after epoch {record.epoch}: stopping")


class Checkpoints(Callback):
    """output.checkpoint_every: a checkpoint on its cadence, at the last epoch, and at the
    epoch a stop makes the last."""

    def __init__(self, every: int, epochs: int):
        self.every, self.epochs = every, epochs

    def epoch_end(self, trainer: Trainer, epoch: int, record: EpochRecord) -> None:
        if checkpoint.due(epoch + 1, self.epochs, self.every) or trainer.stopping:
            trainer.save(epoch + 1)


class WorkerChoice(Callback):
    """data.workers=auto: after the first epoch, the loader workers for the rest of the run
    from its measured step and load times (hvdcls.data.workers)."""

    def epoch_end(self, trainer: Trainer, epoch: int, record: EpochRecord) -> None:
        if not trainer.workers.deciding or epoch + 1 >= trainer.config.training.epochs or trainer.stopping:
            return
        next_batches = trainer.epoch_batches(epoch + 1, trainer.shards.batches(epoch + 1))
        trainer.outputs.say(trainer.workers.choose(next_batches, record.train_seconds,
                                                   record.data_wait_seconds, trainer.steps_per_epoch))


def for_run(trainer: Trainer) -> Callbacks:
    """The add-ons the trainer's config asks for, in the order their hooks must run."""
    config = trainer.config
    items: list[Callback] = [FaultHooks(trainer.faults)]
    if config.training.profile_steps and not config.training.elastic:  # a reset would cut a trace
        items.append(Profiling(config.training.profile_steps))
    if trainer.ema is not None:
        items.append(ModelEma(trainer.ema))
    if config.training.freeze_epochs:
        items.append(FrozenEpochs(config.training.freeze_epochs))
    if trainer.rebalancer is not None:
        items.append(Rebalancing(trainer.rebalancer))
    if config.training.target_accuracy is not None:
        items.append(TargetStop(config.training.target_accuracy))
    items.append(Checkpoints(config.output.checkpoint_every, config.training.epochs))
    items.append(WorkerChoice())
    return Callbacks(items)
