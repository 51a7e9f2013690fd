"""The learning-rate range test on a backend: `optimizer.lr=auto` and `hvdcls lr-find`.

Every rank trains the same number of steps at the same rates on its own shard of the
training data, as training would (parallel.tensor: its replica's shard, which the T ranks of a
replica share); after each step the loss is summed over ranks with one
all-reduce, so every rank sees the same global mean loss, smooths it alike and stops at the
same step (hvdcls.training.lr_find makes every decision from those values alone). The
choice is then gathered from every rank: they must agree, and the summary keeps each. The
model, the optimizer and the rest of the training state are snapshotted before the first
step and restored after the last, so training starts from exactly the weights it would have
started from without the test (the Backend contract's snapshot/restore).

Fine-tuning (hvdcls.finetune): the sweep runs right after build, so it sweeps what the first
epoch trains: with training.freeze_epochs > 0 the head alone (build leaves the model frozen),
and under optimizer.layer_decay the head's rate, every block below at its multiple of it (the
choice is the head's rate, as optimizer.lr is). Its loss is the training loss, class weights
and all.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Generator, Iterable, Optional

from hvdcls.backend import Backend, Context
from hvdcls.config import AUTO_LR, DEFAULT_LR, Config, lr_scale
from hvdcls.data.batches import EpochBatches
from hvdcls.data.mixing import BatchMix
from hvdcls.data.sharding import TrainShards
from hvdcls.data.sources import Data
from hvdcls.data.transforms import Preprocess
from hvdcls.data.workers import LoaderWorkers
from hvdcls.maths.tensor_parallel import Layout
from hvdcls.training import lr_find
from hvdcls.training.loop import grouped, loss_class_weights
from hvdcls.training.watchdog import IN_STEP, READING, Phases

# The rate when the curve tells nothing (a flat sweep): the schema's default, 0.1 per 256.
FALLBACK_LR = DEFAULT_LR


@dataclass(frozen=True)
class Sweep:
    """One range test: the rates stepped at, the global mean losses, their smoothing, and
    the choice (as the step rate at this world's global batch)."""

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    choice: lr_find.Choice
    config_lr: float  # the choice in optimizer.lr's units (per 256 images under per256)
    seconds: float

    def as_dict(self, rank_choices: Optional[list] = None) -> dict:
        """summary.json's `lr_find` (and lr_find.json's)."""
        choice = self.choice
        return {"lr": choice.lr, "config_lr": self.config_lr, "reason": choice.reason,
                "rule": lr_find.RULE, "steps": len(self.lrs), "diverged": choice.diverged,
                "read_at": choice.at, "shrink": choice.shrink, "noise": choice.noise,
                "seconds": round(self.seconds, 3), "rank_choices": rank_choices,
                "curve": [[lr, finite(loss), finite(smooth)]
                          for lr, loss, smooth in zip(self.lrs, self.losses, self.smoothed)]}


def finite(value: float) -> Optional[float]:
    """A diverged loss (nan, inf) as JSON's null: summary.json stays strict JSON."""
    return value if math.isfinite(value) else None


def replicas(config: Config, ctx: Context) -> tuple[int, int]:
    """(replicas, this rank's): the data is dealt over the replicas, as training deals it
    (parallel.tensor: a replica's T ranks read the same batches; else one replica a rank)."""
    layout = Layout(ctx.size, config.parallel.tensor)
    return layout.replicas, layout.replica(ctx.rank)


def shards_of(config: Config, ctx: Context, data: Data) -> TrainShards:
    count, replica = replicas(config, ctx)
    return TrainShards(len(data.train), count, replica, config.training.batch_size,
                       config.horovod.backward_passes_per_step, config.training.seed)


def batches(config: Config, backend: Backend, ctx: Context, data: Data) -> Generator[list, None, None]:
    """This rank's training micro-batches, grouped into steps, epoch after epoch (a small data
    set has fewer steps in an epoch than the sweep takes), as training would read them."""
    training = config.training
    passes = config.horovod.backward_passes_per_step
    shards = shards_of(config, ctx, data)
    preprocess = Preprocess(config.data, training.seed, data.augment.get("preset"))
    mix = BatchMix(config.data, data.num_classes, training.seed)
    workers = LoaderWorkers(config.data.workers, ctx.local_size, passes)  # auto: the most, as epoch 1 has
    epoch = 0
    while True:
        read = EpochBatches(data.train, shards.batches(epoch), preprocess, epoch, train=True, mix=mix)
        steps = 0
        for group in grouped(backend.loader(read, workers.count), passes):
            steps += 1
            yield group
        if not steps:  # no full step in an epoch: the data set is smaller than one global batch
            return
        epoch += 1


def run(config: Config, backend: Backend, ctx: Context, data: Data,
        phases: Optional[Phases] = None) -> Sweep:
    """The sweep, every rank together (collectives: every rank calls it); the training state
    is restored before it returns, whatever happens inside."""
    phases = phases or Phases()
    settings = config.optimizer.lr_find
    planned = lr_find.rates(settings.min_lr, settings.max_lr, settings.steps)
    scale = lr_scale(config.optimizer, replicas(config, ctx)[0], config.horovod.backward_passes_per_step,
                     config.training.batch_size)
    started = time.perf_counter()
    if config.training.class_weights != "none":  # the loss training will minimise
        backend.set_class_weights(loss_class_weights(config, data))
    saved = backend.snapshot()
    read = batches(config, backend, ctx, data)
    try:
        lrs, losses, smoothed = steps(backend, planned, read, phases)
    finally:
        read.close()  # the loader's workers stop now, not when collected
        backend.restore(saved)
    choice = lr_find.choose(lrs, losses, smoothed, FALLBACK_LR * scale, schedule_steps(config, ctx, data))
    return Sweep(lrs, losses, smoothed, choice, choice.lr / scale if scale else choice.lr,
                 time.perf_counter() - started)


def schedule_steps(config: Config, ctx: Context, data: Data) -> int:
    """The optimizer steps the training to come takes (its epochs x steps an epoch)."""
    return config.training.epochs * shards_of(config, ctx, data).steps_per_epoch


def steps(backend: Backend, planned: list[float], micro_batches: Iterable[list],
          phases: Phases) -> tuple[list[float], list[float], list[float]]:
    """Train one step of `micro_batches` at each planned rate until the rates or the batches
    run out or the loss diverges; returns (rates, global mean losses, smoothed losses)."""
    smoother = lr_find.Smoother()
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    phases.slow_until_step(READING, 0)  # the first step may compile
    for i, (lr, micro) in enumerate(zip(planned, micro_batches)):
        phases.enter(IN_STEP, i)
        sums = backend.train_step(micro, lr)
        # Horovod: the global mean loss, the same value on every rank, so every rank decides alike
        # (parallel.tensor: each replica's sums T times over, numerator and count alike)
        loss_sum, count = backend.allreduce_sum([float(sums.loss), float(sums.count)], f"lr_find.{i}")
        lrs.append(lr)
        losses.append(loss_sum / max(count, 1.0))
        smoothed.append(smoother.add(losses[-1]))
        phases.step_done(i)
        if smoother.diverged(smoothed[-1]):
            break
        phases.enter(READING, i + 1)
    return lrs, losses, smoothed


def agreed(backend: Backend, ctx: Context, sweep: Sweep) -> list:
    """Every rank's (rate, steps) in rank order; a disagreement is a bug, not a user's error."""
    mine = [sweep.choice.lr, len(sweep.lrs)]
    every = backend.allgather_object(mine, "lr_find.choice") if ctx.size > 1 else [mine]
    if any(theirs != mine for theirs in every):
        raise RuntimeError(f"the learning-rate range test chose differently on the ranks: {every}")
    return every


def resolve(config: Config, backend: Backend, ctx: Context, data: Data,
            phases: Optional[Phases] = None,
            resumed_state: Optional[dict] = None) -> tuple[Config, Optional[dict]]:
    """`config` with optimizer.lr a number: as given, or (auto) found by the sweep, whose
    account for summary.json comes second (None when the rate was given). A run resuming a
    checkpoint that recorded its rate trains on at that rate: a second test from other
    weights could choose another, and would only cost time."""
    if config.optimizer.lr != AUTO_LR:
        return config, None
    kept = (resumed_state or {}).get("lr")
    if isinstance(kept, (int, float)) and not isinstance(kept, bool) and kept > 0:
        return with_lr(config, float(kept)), {"config_lr": float(kept), "resumed": True, "steps": 0,
                                              "reason": "the rate of the run it resumes"}
    sweep = run(config, backend, ctx, data, phases)
    account = sweep.as_dict(agreed(backend, ctx, sweep))
    return with_lr(config, sweep.config_lr), account


def with_lr(config: Config, lr: float) -> Config:
    """A copy of `config` whose optimizer.lr is `lr` (the rest shared, as it is never changed)."""
    return dataclasses.replace(config, optimizer=dataclasses.replace(config.optimizer, lr=lr))

