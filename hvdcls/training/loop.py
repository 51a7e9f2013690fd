"""The epoch loop, written once for every backend.

Per optimizer step the core picks the micro-batches, the learning rate and when to log; per
epoch it reduces the metrics exactly over ranks, averages batch-norm statistics, evaluates on
this rank's shard of the validation set and decides whether to checkpoint.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple, Optional

import numpy as np

from hvdcls.backend import Backend, Context, Sums, add
from hvdcls.config import Config
from hvdcls.data.batches import EpochBatches, LoaderWait
from hvdcls.data.sharding import TrainShards, eval_batches
from hvdcls.data.sources import Data
from hvdcls.data.transforms import Preprocess
from hvdcls.observe.monitor import LossReads, Monitor, RunInfo, StepSample
from hvdcls.training import checkpoint, faults, schedule
from hvdcls.training.outputs import RunOutputs
from hvdcls.training.profiling import StepProfiler


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


def as_floats(total: Optional[Sums]) -> list[float]:
    return [0.0, 0.0, 0.0] if total is None else [float(v) for v in total]


@dataclass
class Reduced:
    loss: float
    accuracy: float
    count: int

    @classmethod
    def from_sums(cls, sums: list[float]) -> "Reduced":
        loss, correct, count = sums
        return cls(loss / max(count, 1), correct / max(count, 1), int(round(count)))


class TimedStep(NamedTuple):
    sums: Sums  # framework scalars, for the epoch's exact reduction
    sample: StepSample  # what the monitor sees


@dataclass
class EpochTimes:
    """Rank 0's sums over one epoch's steps (see hvdcls.observe.monitor for their meaning)."""

    data_wait: float = 0.0
    step: float = 0.0
    allreduce: Optional[float] = None  # None: the backend cannot separate it
    sent_before: Optional[tuple] = None  # (gradient bytes, steps) counted before the epoch
    bytes_per_step: Optional[float] = None  # gradient bytes all-reduced per step this epoch

    def add(self, sample: StepSample) -> None:
        self.data_wait += sample.data_wait
        self.step += sample.seconds
        if sample.allreduce is not None:
            self.allreduce = (self.allreduce or 0.0) + sample.allreduce

    def close(self, sent_after: Optional[tuple]) -> None:
        if self.sent_before and sent_after and sent_after[1] > self.sent_before[1]:
            self.bytes_per_step = (sent_after[0] - self.sent_before[0]) / (sent_after[1] - self.sent_before[1])


def sent_bytes(backend: Backend) -> Optional[tuple]:
    """(gradient bytes all-reduced, steps) so far, where the backend counts them."""
    counted = backend.communication()
    return (counted["sent_bytes"], counted["steps"]) if counted else None


class Trainer:
    def __init__(self, config: Config, backend: Backend, ctx: Context, data: Data,
                 outputs: RunOutputs, monitor: Optional[Monitor] = None):
        self.config, self.backend, self.ctx, self.data, self.outputs = config, backend, ctx, data, outputs
        self.monitor = monitor or Monitor([])
        self.passes = config.horovod.backward_passes_per_step
        self.shards = TrainShards(len(data.train), ctx.size, ctx.rank, config.training.batch_size,
                                  self.passes, config.training.seed)
        self.lr_at = schedule.build(config.optimizer, config.schedule, world_size=ctx.size,
                                    backward_passes=self.passes,
                                    steps_per_epoch=self.shards.steps_per_epoch,
                                    epochs=config.training.epochs)
        self.preprocess = Preprocess(config.data, config.training.seed)
        # Every rank trains the same number of full steps, so images per step are known exactly.
        self.images_per_step = config.training.batch_size * self.passes * ctx.size
        self.profiler: Optional[StepProfiler] = None
        self.first_epoch = 0

    def train_epoch(self, epoch: int) -> tuple[Reduced, float, float, EpochTimes]:
        """One pass over this rank's shard; returns (reduced metrics, seconds, last lr, times)."""
        self.backend.seed(epoch_seed(self.config.training.seed, epoch, self.ctx.rank))
        batches = EpochBatches(self.data.train, self.shards.batches(epoch), self.preprocess,
                               epoch, train=True)
        steps = self.shards.steps_per_epoch
        total, lr, times = None, 0.0, EpochTimes(sent_before=sent_bytes(self.backend))
        loss_reads = LossReads(self.config.training.log_every)
        started = time.perf_counter()
        loader = LoaderWait(self.backend.loader(batches, self.config.data.workers))
        for step, micro in enumerate(grouped(loader, self.passes)):
            faults.stall_point(self.ctx.rank, step, epoch == self.first_epoch)  # inert outside tests
            lr = self.lr_at(epoch * steps + step)
            sample = self.timed_step(epoch, step, micro, lr, loader.take(), loss_reads)
            total = add(total, sample.sums)
            times.add(sample.sample)
            self.monitor.step(sample.sample)
        seconds = time.perf_counter() - started
        times.close(sent_bytes(self.backend))
        reduced = self.backend.allreduce_sum(as_floats(total), f"train_metrics.{epoch}")
        return Reduced.from_sums(reduced), seconds, lr, times

    def timed_step(self, epoch: int, step: int, micro: list, lr: float, data_wait: float,
                   loss_reads: LossReads) -> "TimedStep":
        if self.profiler:
            self.profiler.before_step(epoch, step)
        started = time.perf_counter()
        sums = self.backend.train_step(micro, lr)
        seconds = time.perf_counter() - started
        if self.profiler:
            self.profiler.after_step(epoch, step)
        loss = None
        if loss_reads.due(step, self.shards.steps_per_epoch, time.perf_counter()):
            loss = float(sums.loss) / float(sums.count)  # waits for the device: not every step
        sample = StepSample(epoch, step, self.images_per_step, seconds, data_wait,
                            self.backend.allreduce_wait_seconds(), lr, loss)
        return TimedStep(sums, sample)

    def evaluate(self) -> Reduced:
        """Validation on this rank's shard, reduced exactly: sum(correct) / sum(count)."""
        val = self.data.val
        indices = eval_batches(len(val), self.ctx.size, self.ctx.rank, self.config.training.batch_size)
        batches = EpochBatches(val, indices, self.preprocess, 0, train=False)
        total = None
        for batch in self.backend.loader(batches, self.config.data.workers):
            total = add(total, self.backend.eval_step(batch))
        return Reduced.from_sums(self.backend.allreduce_sum(as_floats(total), "val_metrics"))

    def run(self, start_epoch: int, history: list[dict]) -> list[dict]:
        """Epochs start_epoch+1 .. epochs; returns the metrics of every epoch of the run."""
        self.outputs.start(history)
        epochs = self.config.training.epochs
        self.monitor.start(RunInfo(self.ctx.backend, self.config.model.name, self.data.name,
                                   self.ctx.size, epochs, self.shards.steps_per_epoch, start_epoch))
        self.profiler = self.make_profiler(start_epoch)
        self.first_epoch = start_epoch
        for epoch in range(start_epoch, epochs):
            started = time.perf_counter()
            train, train_seconds, lr, times = self.train_epoch(epoch)
            self.backend.sync_buffers()  # Horovod: BN statistics are not gradients; average them
            val = self.evaluate()
            record = self.record(epoch, train, val, lr, train_seconds, time.perf_counter() - started,
                                 times)
            self.outputs.add_epoch(record)
            self.monitor.epoch(record, self.outputs.history)
            if checkpoint.due(epoch + 1, epochs, self.config.output.checkpoint_every):
                self.save(epoch + 1)
        return self.outputs.history

    def make_profiler(self, start_epoch: int) -> Optional[StepProfiler]:
        """Rank 0 profiles training.profile_steps steps of this run's first epoch."""
        wanted = self.config.training.profile_steps
        if not wanted or not self.ctx.is_main:
            return None
        return StepProfiler(self.backend.profiler, self.outputs.run_dir, start_epoch,
                            self.shards.steps_per_epoch, wanted, self.monitor.note)

    def record(self, epoch: int, train: Reduced, val: Reduced, lr: float,
               train_seconds: float, seconds: float, times: EpochTimes) -> dict:
        return {"epoch": epoch + 1, "train_loss": train.loss, "train_accuracy": train.accuracy,
                "val_loss": val.loss, "val_accuracy": val.accuracy, "lr": lr,
                "images_per_sec": train.count / train_seconds, "train_images": train.count,
                "val_images": val.count, "train_seconds": train_seconds, "epoch_seconds": seconds,
                "world_size": self.ctx.size, "steps": self.shards.steps_per_epoch,
                "data_wait_seconds": times.data_wait, "data_wait_share": times.data_wait / train_seconds,
                "step_seconds": times.step, "allreduce_wait_seconds": times.allreduce,
                "allreduce_share": None if times.allreduce is None else times.allreduce / train_seconds,
                "allreduce_bytes_per_step": times.bytes_per_step}

    def save(self, epochs_done: int) -> None:
        self.backend.prepare_checkpoint()  # every rank: it may be a collective
        if not self.ctx.is_main:  # Horovod: weights are identical on every rank; rank 0 writes
            return
        history = self.outputs.history
        state = {"backend": self.ctx.backend, "epoch": epochs_done,
                 "global_step": epochs_done * self.shards.steps_per_epoch,
                 "world_size": self.ctx.size, "seed": self.config.training.seed,
                 "best_val_accuracy": max(r["val_accuracy"] for r in history), "history": history}
        path = checkpoint.save(self.outputs.checkpoints_dir, epochs_done, state, self.backend.save,
                               self.config.output.keep_checkpoints)
        self.monitor.note(f"checkpoint {path}")
