"""The epoch loop, written once for every backend and for plain and elastic runs alike.

Per optimizer step the core picks the micro-batches, the learning rate and when to log; per
epoch it reduces the metrics exactly over ranks, averages batch-norm statistics, evaluates on
this rank's shard of the validation set and decides whether to checkpoint.

`Trainer.run_steps` is the one step loop and `Trainer.end_epoch` the one epoch end; a plain
run drives them from `Trainer.run`, an elastic one from hvdcls.training.elastic. What a run adds
around them (the EMA, balancing, the profiler, checkpoints, the target stop, elastic's commits,
...) is a callback on the trainer's one hook list, hvdcls.training.callbacks.
"""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

import numpy as np

from hvdcls import finetune, strategy
from hvdcls.backend import Backend, Context, Sums, add
from hvdcls.config import Config
from hvdcls.data.batches import EpochBatches, LoaderWait
from hvdcls.data.mixing import BatchMix
from hvdcls.data.sharding import BalancedShards, ElasticShards, TrainShards, class_balanced_weights, eval_batches
from hvdcls.data.sources import Data
from hvdcls.data.transforms import Preprocess
from hvdcls.data.workers import LoaderWorkers
from hvdcls.files import status_file
from hvdcls.maths import zero as zero_plan
from hvdcls.maths.tensor_parallel import Layout
from hvdcls.observe.classification import RunningMetrics, write_outputs
from hvdcls.observe.monitor import EpochRecord, LossReads, Monitor, RunInfo, StepSample
from hvdcls.training import balance, callbacks, checkpoint, ema, faults, memory, schedule
from hvdcls.training.outputs import RunOutputs
from hvdcls.training.tallies import EpochTimes, Reduced, Tally, as_floats, eval_floats
from hvdcls.training.watchdog import (
    ALLREDUCE,
    CHECKPOINTING,
    COMPUTING,
    EPOCH_COLLECTIVES,
    EVALUATING,
    IN_STEP,
    READING,
    RECORDING,
    Phases,
)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """Framework RNG seed for one rank and epoch: a resumed run draws what the original did."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


def grouped(batches: Iterable, size: int) -> Iterator[list]:
    """Consecutive groups of `size` micro-batches (sharding makes the count a multiple)."""
    group: list = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []


class TimedStep(NamedTuple):
    sums: Sums  # framework scalars, for the epoch's exact reduction
    sample: StepSample  # what the monitor sees


def shifted(lr_at: Callable[[Any], float], first: float) -> Callable[[int], float]:
    """The schedule `lr_at` as seen by a run of steps that starts at its step `first`."""
    return lambda i: lr_at(first + i)


def epoch_record(epoch: int, train: Reduced, val: Reduced, lr: float, train_seconds: float,
                 epoch_seconds: float, times: EpochTimes, world_size: int,
                 steps: int, ema_val: Optional[Reduced] = None,
                 plan: Optional[balance.Plan] = None, wall_time: Optional[float] = None) -> EpochRecord:
    """One epoch's line of metrics.jsonl from its reduced metrics and rank 0's timings (and
    the model EMA's validation, and the balancer's plan in force, where there are ones)."""
    allreduce_share = None if times.allreduce is None else times.allreduce / train_seconds
    return EpochRecord(
        epoch=epoch + 1, train_loss=train.loss, train_accuracy=train.accuracy, val_loss=val.loss,
        val_accuracy=val.accuracy, lr=lr, images_per_sec=train.count / train_seconds,
        train_images=train.count, val_images=val.count, train_seconds=train_seconds,
        epoch_seconds=epoch_seconds, world_size=world_size, steps=steps,
        data_wait_seconds=times.data_wait, data_wait_share=times.data_wait / train_seconds,
        step_seconds=times.step, allreduce_wait_seconds=times.allreduce,
        allreduce_share=allreduce_share, allreduce_bytes_per_step=times.bytes_per_step,
        ema_val_loss=ema_val.loss if ema_val else None,
        ema_val_accuracy=ema_val.accuracy if ema_val else None, val_top5=val.top5,
        balance_batches=None if plan is None else list(plan.batches),
        balance_speeds=None if plan is None or plan.speeds is None else [round(v, 3) for v in plan.speeds],
        wall_time=wall_time)


def train_labels(data: Data) -> np.ndarray:
    """Every training sample's class, in index order."""
    train = data.train
    return np.fromiter((train.label(i) for i in range(len(train))), np.int64, len(train))


def sampler_weights(config: Config, data: Data) -> Optional[np.ndarray]:
    """data.sampler=balanced: each training sample's draw probability; None: shuffle."""
    if config.data.sampler != "balanced":
        return None
    return class_balanced_weights(train_labels(data))


def loss_class_weights(config: Config, data: Data) -> Optional[list[float]]:
    """training.class_weights=auto: the loss's weight per class, from the training labels."""
    if config.training.class_weights != "auto":
        return None
    return finetune.class_weights(train_labels(data), data.num_classes)


def world_hosts(backend: Backend, ctx: Context) -> dict[str, int]:
    """Ranks per host of this world (a collective: every rank calls it), for rank 0's
    status.json: what the job itself says it runs on, after an elastic reset too."""
    hosts = backend.allgather_object(ctx.host, "world_hosts") if ctx.size > 1 else [ctx.host]
    return dict(Counter(hosts))


def sent_bytes(backend: Backend) -> Optional[tuple]:
    """(gradient bytes all-reduced, steps) so far, where the backend counts them."""
    counted = backend.communication()
    return (counted["sent_bytes"], counted["steps"]) if counted else None


class Trainer:
    """One world's training: built per run (plain) or per elastic attempt (hvdcls.training.elastic).

    Public for the elastic driver and the callbacks: `begin`, `epoch_batches`, `run_steps`,
    `end_epoch`, `evaluate`, `save`, and the attributes `ctx`, `outputs`, `shards`,
    `elastic_shards`, `steps_per_epoch`, `lr_at` and `callbacks`."""

    def __init__(self, config: Config, backend: Backend, ctx: Context, data: Data,
                 outputs: RunOutputs, monitor: Optional[Monitor] = None,
                 phases: Optional[Phases] = None, start_step: int = 0):
        """`start_step`: the global step this trainer starts at (elastic: an attempt's)."""
        self.config, self.backend, self.ctx, self.data, self.outputs = config, backend, ctx, data, outputs
        self.monitor = monitor or Monitor([])
        # Where this rank is, for its watchdog (hvdcls.training.watchdog); inert without one.
        self.phases = phases or Phases()
        backend.allreduce_wait_hook = lambda: self.phases.enter(ALLREDUCE)
        self.step_phase = COMPUTING if backend.marks_allreduce_wait else IN_STEP
        self.passes = config.horovod.backward_passes_per_step
        # parallel.tensor: the T ranks of a replica read the same batches, so the data is dealt
        # (and balanced) over the replicas (np / T) and each replica's first rank alone counts
        # its metrics
        self.layout = Layout(ctx.size, config.parallel.tensor)
        self.replicas, self.replica = self.layout.replicas, self.layout.replica(ctx.rank)
        balancing = balance.settings(config, self.replicas, ctx.device.startswith("cuda"))
        shards = TrainShards if balancing.mode == "off" else BalancedShards
        self.shards = shards(len(data.train), self.replicas, self.replica, config.training.batch_size,
                             self.passes, config.training.seed, sampler_weights(config, data))  # a plain run's batches
        # An elastic attempt's batches come from ElasticShards (hvdcls.training.elastic): no
        # wrap-around padding, so an epoch may have fewer steps (959 images, 3 ranks, batch 32:
        # 9, not 10). The count of the shards the batches come from is `steps_per_epoch`, the
        # one the schedule, the EMA cadence, the progress and the checkpoints' step all use,
        # so the schedule ends on the last step either way.
        self.elastic_shards = (ElasticShards(len(data.train), ctx.size, ctx.rank, config.training.batch_size,
                                             self.passes, config.training.seed)
                               if config.training.elastic else None)
        self.steps_per_epoch = (self.elastic_shards or self.shards).steps_per_epoch
        # training.balance: the plan in force, re-planned from measured compute when dynamic
        self.rebalancer = (None if balancing.mode == "off"
                           else balance.Rebalancer(balancing, self.replicas, self.replica, start_step))
        # The global step of the epoch's step 0, which numbers the steps a new plan starts
        # at; an elastic attempt sets it, as its world's steps since the epoch began are not
        # the run's.
        self.step_origin = 0
        self.warned_unshared = False  # training.zero: said once that some rank writes its shard on its own host
        self.lr_at = schedule.build(config.optimizer, config.schedule, world_size=self.replicas,
                                    backward_passes=self.passes,
                                    steps_per_epoch=self.steps_per_epoch,
                                    epochs=config.training.epochs,
                                    batch_size=config.training.batch_size)
        self.preprocess = Preprocess(config.data, config.training.seed, data.augment.get("preset"))
        self.mix = BatchMix(config.data, data.num_classes, config.training.seed)
        self.workers = LoaderWorkers(config.data.workers, ctx.local_size, self.passes)
        # Every rank trains the same number of full steps, so images per step are known exactly.
        self.images_per_step = config.training.batch_size * self.passes * self.replicas
        self.ema = ema.schedule_for(config, self.images_per_step)  # None: no model EMA
        self.first_epoch = 0
        self.faults = faults.StepHooks.read(ctx.rank)  # test hooks, read once; inert outside tests
        self.stopping: Optional[str] = None  # why the epoch just ended is the run's last (a callback's)
        self.callbacks = callbacks.for_run(self)

    def begin(self, start_epoch: int, history: list[EpochRecord],
              hosts: Optional[dict[str, int]] = None) -> None:
        """The run (or attempt) starts after `start_epoch` epochs whose records are `history`,
        on `hosts` (world_hosts) when gathered."""
        self.outputs.start(history)
        if self.config.training.class_weights != "none":
            self.backend.set_class_weights(loss_class_weights(self.config, self.data))
        self.monitor.start(RunInfo(self.ctx.backend, self.config.model.name, self.data.name,
                                   self.ctx.size, self.config.training.epochs,
                                   self.steps_per_epoch, start_epoch, hosts,
                                   history[-1].as_dict() if history else None))
        self.callbacks.run_begin(self, start_epoch)

    def run(self, start_epoch: int, history: list[EpochRecord]) -> list[EpochRecord]:
        """Epochs start_epoch+1 .. epochs; returns the records of every epoch of the run."""
        self.first_epoch = start_epoch
        memory.PEAKS.enter(memory.TRAINING)
        self.begin(start_epoch, history, world_hosts(self.backend, self.ctx))
        if start_epoch >= self.config.training.epochs:  # e.g. the service requeued a job that had just finished
            self.outputs.say(f"nothing left to train: the checkpoint holds {start_epoch} epoch(s) of "
                             f"training.epochs={self.config.training.epochs}")
        for epoch in range(start_epoch, self.config.training.epochs):
            started = time.perf_counter()
            train, train_seconds, lr, times = self.train_epoch(epoch)
            self.end_epoch(epoch, train, lr, train_seconds, times, self.steps_per_epoch, started)
            if self.stopping:
                self.outputs.say(self.stopping)
                break
        return self.outputs.history

    def train_epoch(self, epoch: int) -> tuple[Reduced, float, float, EpochTimes]:
        """One pass over this rank's shard; returns (reduced metrics, seconds, last lr, times)."""
        self.backend.seed(epoch_seed(self.config.training.seed, epoch, self.ctx.rank))
        self.callbacks.epoch_begin(self, epoch)
        steps = self.steps_per_epoch
        times = EpochTimes(sent_before=sent_bytes(self.backend))

        def lr_at(i: int) -> float:
            return self.lr_at(epoch * steps + i)

        self.step_origin = epoch * steps
        if self.rebalancer is None:
            batches = self.epoch_batches(epoch, self.shards.batches(epoch))
            tally = self.run_steps(epoch, batches, 0, lr_at, times)
        else:
            tally = self.run_balanced(epoch, lr_at, times)
        seconds = tally.seconds()
        times.close(sent_bytes(self.backend))
        self.phases.enter(EPOCH_COLLECTIVES)
        reduced = self.sum_counted(as_floats(tally.total), f"train_metrics.{epoch}")
        return Reduced.from_sums(reduced), seconds, tally.lr, times

    def run_balanced(self, epoch: int, lr_at: Callable[[int], float], times: EpochTimes) -> Tally:
        """The epoch's steps under the balancer's plans: one loader per plan in force, as a
        new plan changes what every later step reads (at a step boundary, on every rank)."""
        assert isinstance(self.shards, BalancedShards) and self.rebalancer is not None
        tally, step = Tally(), 0
        while step < self.steps_per_epoch:
            indices = self.shards.balanced_batches(epoch, self.rebalancer.plan.batches, step)
            segment = self.run_steps(epoch, self.epoch_batches(epoch, indices), step,
                                     shifted(lr_at, step), times)
            tally.merge(segment)
            step += segment.steps
        return tally

    def grad_weight(self) -> float:
        return 1.0 if self.rebalancer is None else self.rebalancer.plan.weight(self.replica)

    def epoch_batches(self, epoch: int, indices: list) -> EpochBatches:
        """This rank's training micro-batches `indices` of `epoch`, read and augmented."""
        return EpochBatches(self.data.train, indices, self.preprocess, epoch, train=True,
                            mix=self.mix)

    def run_steps(self, epoch: int, batches: EpochBatches, first_step: int,
                  lr_at: Callable[[int], float], times: EpochTimes) -> Tally:
        """The step loop: every optimizer step of `batches`, numbered from `first_step` within
        the epoch, the i-th at learning rate lr_at(i); rank 0's timings go into `times` and
        to the monitor. Returns the tally of the steps since it began or a callback restarted
        it; it ends early when a callback makes the batches stale (a new balancing plan)."""
        tally = Tally()
        loss_reads = LossReads(self.config.training.log_every)
        batches = self.callbacks.batches(self, batches, first_step, epoch == self.first_epoch)
        loader = LoaderWait(self.backend.loader(batches, self.workers.count))
        # Asked only once reading is overdue: which loader worker holds the batch waited for.
        def worker():
            return self.backend.loader_worker(loader, batches)

        self.phases.slow_until_step(READING, first_step, worker)
        for i, micro in enumerate(grouped(loader, self.passes)):
            step = first_step + i
            self.phases.enter(self.step_phase, step)
            self.callbacks.before_step(self, epoch, step)
            lr = lr_at(i)
            timed = self.timed_step(epoch, step, micro, lr, loader.take(), loss_reads)
            tally.add(timed.sums, lr)
            times.add(timed.sample)
            self.monitor.step(timed.sample)
            self.phases.step_done(step)
            if self.callbacks.after_step(self, tally, timed.sample):
                break  # the plan changed: the next steps read from a new loader
            self.phases.enter(READING, step + 1, worker)
        return tally

    def timed_step(self, epoch: int, step: int, micro: list, lr: float, data_wait: float,
                   loss_reads: LossReads) -> "TimedStep":
        started = time.perf_counter()
        sums = self.backend.train_step(micro, lr, self.grad_weight())
        compute = time.perf_counter() - started - (self.backend.allreduce_wait_seconds() or 0.0)
        self.callbacks.after_compute(self, epoch, step, compute)
        seconds = time.perf_counter() - started
        loss = None
        if loss_reads.due(step, self.steps_per_epoch, time.perf_counter()):
            loss = float(sums.loss) / float(sums.count)  # waits for the device: not every step
        sample = StepSample(epoch, step, self.images_per_step, seconds, data_wait,
                            self.backend.allreduce_wait_seconds(), lr, loss)
        return TimedStep(sums, sample)

    def end_epoch(self, epoch: int, train: Reduced, lr: float, train_seconds: float,
                  times: EpochTimes, steps: int, started: Optional[float]) -> EpochRecord:
        """Evaluate, record and maybe checkpoint the epoch (every rank: collectives inside).
        `started`: when the epoch began, for its wall time; None where it spans attempts
        (elastic), and then only its training time is known and stands for it."""
        self.phases.slow_until_step(EPOCH_COLLECTIVES)
        self.monitor.phase(status_file.EVALUATING)
        self.backend.sync_buffers()  # Horovod: BN statistics are not gradients; average them
        val = self.evaluate()
        ema_val = self.callbacks.validations(self).get("ema")
        seconds = train_seconds if started is None else time.perf_counter() - started
        record = epoch_record(epoch, train, val, lr, train_seconds, seconds, times,
                              self.ctx.size, steps, ema_val, self.rebalancer.plan if self.rebalancer else None,
                              wall_time=time.time())
        self.phases.enter(RECORDING)
        self.outputs.add_epoch(record)
        self.monitor.epoch(record, self.outputs.history)
        self.callbacks.validated(self, epoch, record)  # a stop is decided here
        if epoch + 1 == self.config.training.epochs or self.stopping:  # evaluated with the EMA's weights when kept
            self.write_evaluation(ema_val or val, "ema" if ema_val else "model", epoch + 1)
        self.callbacks.epoch_end(self, epoch, record)  # checkpoints among them
        return record

    def evaluate(self) -> Reduced:
        """Validation on this rank's shard, reduced exactly: sum(correct) / sum(count)."""
        val = self.data.val
        indices = eval_batches(len(val), self.replicas, self.replica, self.config.training.batch_size)
        batches = EpochBatches(val, indices, self.preprocess, 0, train=False)
        total = None
        self.phases.enter(EVALUATING)
        for batch in self.backend.loader(batches, self.workers.count):
            total = add(total, self.backend.eval_step(batch))
            self.phases.beat()
        self.phases.enter(EPOCH_COLLECTIVES)
        sums = eval_floats(total, self.data.num_classes)
        return Reduced.from_sums(self.sum_counted(sums, "val_metrics"))

    def sum_counted(self, values: list[float], name: str) -> list[float]:
        """Metric sums over the ranks, each replica's counted once (parallel.tensor: its T ranks
        computed the same ones)."""
        counted = self.layout.tensor_rank(self.ctx.rank) == 0
        return self.backend.allreduce_sum(values if counted else [0.0] * len(values), name)

    def write_evaluation(self, val: Reduced, weights: str, epoch: int, extra: Optional[dict] = None) -> None:
        """Rank 0: the run's last validation as evaluation.json, confusion_matrix.csv and .png
        (what `hvdcls evaluate RUN_DIR` writes, here from the training's own sharded pass)."""
        if not self.ctx.is_main or val.confusion is None:
            return
        hits = None if val.top5 is None else val.top5 * val.count
        result = RunningMetrics.from_counts(val.confusion, hits).result(self.data.classes)
        result.update(class_names=self.data.classes, weights=weights, epoch=epoch, val_loss=val.loss,
                      data={"split": self.data.description.get("val_from", "val"), "images": val.count,
                            "format": self.data.name, "path": self.data.description.get("path")})
        result.update(extra or {})
        write_outputs(self.outputs.run_dir, result)

    def save(self, epochs_done: int) -> None:
        memory.PEAKS.enter(memory.CHECKPOINT)  # summary.json: a write's peak beside a step's
        try:
            self.write_checkpoint(epochs_done)
        finally:
            memory.PEAKS.enter(memory.TRAINING)

    def write_checkpoint(self, epochs_done: int) -> None:
        self.phases.enter(CHECKPOINTING)
        self.monitor.phase(status_file.CHECKPOINTING)
        tmp = checkpoint.begin(self.outputs.checkpoints_dir, epochs_done) if self.ctx.is_main else None
        shard_dir = self.shard_directory(tmp, epochs_done) if strategy.writes_shard_files(self.config) else None
        self.backend.prepare_checkpoint(shard_dir)  # every rank: it may be a collective
        if shard_dir is not None:  # every rank's shard is written before rank 0 renames the directory
            self.backend.allreduce_sum([0.0], "checkpoint_shards_written")
            if tmp is not None:  # a rank that saw rank 0's directory late wrote beside it: keep its shard
                checkpoint.adopt(tmp, epochs_done, zero_plan.shard_glob(self.ctx.size))
        if tmp is None:  # Horovod: weights are identical on every rank; rank 0 writes
            return
        history = self.outputs.history
        state = {"backend": self.ctx.backend, "epoch": epochs_done,
                 "global_step": epochs_done * self.steps_per_epoch,
                 "world_size": self.ctx.size, "seed": self.config.training.seed,
                 "lr": self.config.optimizer.lr,  # a number here (auto was resolved): a resume keeps it
                 "best_val_accuracy": max(r.val_accuracy for r in history),
                 "history": [r.as_dict() for r in history]}
        path = checkpoint.commit(tmp, epochs_done, state, self.backend.save, self.config.output.keep_checkpoints)
        self.monitor.note(f"checkpoint {path}")

    def shard_directory(self, tmp: Optional[Path], epochs_done: int) -> Path:
        """Where this rank writes its training.zero shard (a collective): rank 0's temporary
        checkpoint directory where it sees it (one filesystem); else its own host's copy of the
        checkpoint's directory, as on hosts that share no filesystem. No rank gathers the state."""
        token = checkpoint.mark_shared(tmp) if tmp is not None else None
        path, token = self.backend.broadcast_object((str(tmp) if tmp else None, token), "checkpoint_dir")
        sees = checkpoint.sees(path, token)
        seen = self.backend.allreduce_sum([1.0 if sees else 0.0], "checkpoint_shared")
        if seen[0] < self.ctx.size and not self.warned_unshared:
            self.monitor.note(f"training.zero: {self.ctx.size - int(seen[0])} rank(s) cannot see rank 0's "
                              "checkpoint directory; each writes its shard into its own host's copy of it "
                              "(docs/training.md: hosts that share no filesystem)")
            self.warned_unshared = True
        if sees:
            return Path(path)
        return checkpoint.host_copy(self.outputs.checkpoints_dir, epochs_done, self.config.output.keep_checkpoints)
