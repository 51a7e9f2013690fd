"""The epoch loop, written once for every backend.

Per optimizer step the core picks the micro-batches, the learning rate and when to log; per
epoch it reduces the metrics exactly over ranks, averages batch-norm statistics, evaluates on
this rank's shard of the validation set and decides whether to checkpoint.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np

from hvdcls import checkpoint, schedule
from hvdcls.backend import Backend, Context, Sums
from hvdcls.batches import EpochBatches
from hvdcls.config import Config
from hvdcls.datasets import Data
from hvdcls.outputs import RunOutputs
from hvdcls.sharding import TrainShards, eval_batches
from hvdcls.transforms import Preprocess


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


def add(total: Optional[Sums], step: Sums) -> Sums:
    """Running sums in the framework's own dtypes (starting from the first step's, not 0.0:
    TensorFlow will not add a Python float to an int32 tensor)."""
    return step if total is None else Sums(*(a + b for a, b in zip(total, step)))


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


class Trainer:
    def __init__(self, config: Config, backend: Backend, ctx: Context, data: Data,
                 outputs: RunOutputs):
        self.config, self.backend, self.ctx, self.data, self.outputs = config, backend, ctx, data, outputs
        self.passes = config.horovod.backward_passes_per_step
        self.shards = TrainShards(len(data.train), ctx.size, ctx.rank, config.training.batch_size,
                                  self.passes, config.training.seed)
        self.lr_at = schedule.build(config.optimizer, config.schedule, world_size=ctx.size,
                                    backward_passes=self.passes,
                                    steps_per_epoch=self.shards.steps_per_epoch,
                                    epochs=config.training.epochs)
        self.preprocess = Preprocess(config.data, config.training.seed)

    def train_epoch(self, epoch: int) -> tuple[Reduced, float, float]:
        """One pass over this rank's shard; returns (reduced metrics, seconds, last lr)."""
        self.backend.seed(epoch_seed(self.config.training.seed, epoch, self.ctx.rank))
        batches = EpochBatches(self.data.train, self.shards.batches(epoch), self.preprocess,
                               epoch, train=True)
        steps, log_every = self.shards.steps_per_epoch, self.config.training.log_every
        total, lr, started = None, 0.0, time.perf_counter()
        loader = self.backend.loader(batches, self.config.data.workers)
        for step, micro in enumerate(grouped(loader, self.passes)):
            lr = self.lr_at(epoch * steps + step)
            sums = self.backend.train_step(micro, lr)
            total = add(total, sums)
            if (step + 1) % log_every == 0:
                self.outputs.say(f"epoch {epoch + 1} step {step + 1}/{steps} "
                                 f"loss {float(sums.loss) / float(sums.count):.4f} lr {lr:.4g}")
        seconds = time.perf_counter() - started
        reduced = self.backend.allreduce_sum(as_floats(total), f"train_metrics.{epoch}")
        return Reduced.from_sums(reduced), seconds, lr

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
        for epoch in range(start_epoch, epochs):
            started = time.perf_counter()
            train, train_seconds, lr = self.train_epoch(epoch)
            self.backend.sync_buffers()  # Horovod: BN statistics are not gradients; average them
            val = self.evaluate()
            record = self.record(epoch, train, val, lr, train_seconds, time.perf_counter() - started)
            self.outputs.add_epoch(record)
            self.outputs.say(self.epoch_line(record))
            if checkpoint.due(epoch + 1, epochs, self.config.output.checkpoint_every):
                self.save(epoch + 1)
        return self.outputs.history

    def record(self, epoch: int, train: Reduced, val: Reduced, lr: float,
               train_seconds: float, seconds: float) -> dict:
        return {"epoch": epoch + 1, "train_loss": train.loss, "train_accuracy": train.accuracy,
                "val_loss": val.loss, "val_accuracy": val.accuracy, "lr": lr,
                "images_per_sec": train.count / train_seconds, "train_images": train.count,
                "val_images": val.count, "train_seconds": train_seconds, "epoch_seconds": seconds,
                "world_size": self.ctx.size, "steps": self.shards.steps_per_epoch}

    @staticmethod
    def epoch_line(r: dict) -> str:
        return (f"epoch {r['epoch']}: train loss {r['train_loss']:.4f} acc {r['train_accuracy']:.4f} | "
                f"val loss {r['val_loss']:.4f} acc {r['val_accuracy']:.4f} | lr {r['lr']:.4g} | "
                f"{r['images_per_sec']:.1f} img/s | {r['epoch_seconds']:.1f} s")

    def save(self, epochs_done: int) -> None:
        if not self.ctx.is_main:  # Horovod: weights are identical on every rank; rank 0 writes
            return
        history = self.outputs.history
        state = {"backend": self.ctx.backend, "epoch": epochs_done,
                 "global_step": epochs_done * self.shards.steps_per_epoch,
                 "world_size": self.ctx.size, "seed": self.config.training.seed,
                 "best_val_accuracy": max(r["val_accuracy"] for r in history), "history": history}
        path = checkpoint.save(self.outputs.checkpoints_dir, epochs_done, state, self.backend.save,
                               self.config.output.keep_checkpoints)
        self.outputs.say(f"checkpoint {path}")
