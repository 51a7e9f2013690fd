"""hvdcls.training.loop's helpers: micro-batch grouping, per-rank seeds, exact metric
reduction, the epoch record, and the one step loop over a counting backend."""
import json
from types import SimpleNamespace

import pytest

from hvdcls import config as cfg
from hvdcls.backend import Context, Sums
from hvdcls.observe.monitor import EpochRecord, Monitor, Sink
from hvdcls.training import watchdog
from hvdcls.training.callbacks import Callback
from hvdcls.training.loop import (EpochTimes, Reduced, Trainer, epoch_record,
                                  epoch_seed, grouped)
from hvdcls.training.outputs import RunOutputs


@pytest.mark.parametrize("size", [1, 2, 3, 6])
def test_grouped_even(size):
    groups = list(grouped(range(6), size))
    assert groups == [list(range(i, i + size)) for i in range(0, 6, size)]
    assert all(type(g) is list for g in groups)


def test_grouped_exact_groups():
    assert list(grouped("abcdef", 2)) == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert list(grouped(iter([10, 20, 30, 40]), 4)) == [[10, 20, 30, 40]]
    assert list(grouped([], 3)) == []


def test_grouped_drops_an_incomplete_tail():
    # sharding makes the count a multiple; a stray tail must never become a short optimizer step
    assert list(grouped(range(7), 3)) == [[0, 1, 2], [3, 4, 5]]
    assert list(grouped(range(2), 3)) == []


def test_grouped_is_lazy():
    def source():
        yield 1
        yield 2
        raise AssertionError("read past the first group")

    assert next(grouped(source(), 2)) == [1, 2]


def test_epoch_seed_is_stable():
    assert epoch_seed(0, 0, 0) == epoch_seed(0, 0, 0)
    assert epoch_seed(7, 3, 1) == epoch_seed(7, 3, 1)
    value = epoch_seed(1, 2, 3)
    assert isinstance(value, int) and 0 <= value < 2 ** 32


def test_epoch_seed_differs_by_seed_epoch_and_rank():
    seeds = {epoch_seed(seed, epoch, rank)
             for seed in range(3) for epoch in range(5) for rank in range(4)}
    assert len(seeds) == 3 * 5 * 4
    assert epoch_seed(0, 1, 0) != epoch_seed(0, 0, 1)  # (epoch, rank) is not symmetric


def test_reduced_from_sums():
    reduced = Reduced.from_sums([6.0, 3.0, 4.0])
    assert reduced == Reduced(loss=1.5, accuracy=0.75, count=4)
    assert type(reduced.count) is int


def test_reduced_is_exact_over_ranks():
    # rank 0: 3 of 4 right, loss sum 2; rank 1: 1 of 1 right, loss sum 0.5 -> 4 of 5, 2.5 / 5
    ranks = [(2.0, 3.0, 4.0), (0.5, 1.0, 1.0)]
    summed = [sum(column) for column in zip(*ranks)]
    assert Reduced.from_sums(summed) == Reduced(loss=0.5, accuracy=0.8, count=5)


def test_reduced_rounds_float_counts():
    assert Reduced.from_sums([3.0, 2.0, 3.9999999]).count == 4


def test_reduced_of_nothing_does_not_divide_by_zero():
    assert Reduced.from_sums([0.0, 0.0, 0.0]) == Reduced(loss=0.0, accuracy=0.0, count=0)


def test_epoch_bytes_per_step_from_the_backends_counter():
    times = EpochTimes(sent_before=(1000, 4))
    times.close((1000 + 3 * 250, 7))
    assert times.bytes_per_step == 250
    uncounted = EpochTimes(sent_before=None)
    uncounted.close(None)
    assert uncounted.bytes_per_step is None


# The keys of a metrics.jsonl line, as readers (report, progress, Prometheus, tests) know them.
RECORD_KEYS = {"epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr",
               "images_per_sec", "train_images", "val_images", "train_seconds", "epoch_seconds",
               "world_size", "steps", "data_wait_seconds", "data_wait_share", "step_seconds",
               "allreduce_wait_seconds", "allreduce_share", "allreduce_bytes_per_step",
               "ema_val_loss", "ema_val_accuracy",
               "balance_batches", "balance_speeds", "wall_time", "val_top5"}


def test_epoch_record_is_the_metrics_line():
    times = EpochTimes(data_wait=0.5, step=1.5, allreduce=None, bytes_per_step=None)
    record = epoch_record(2, Reduced(0.5, 0.75, 100), Reduced(0.25, 0.5, 40), 0.1, 2.0, 3.0,
                          times, world_size=2, steps=10)
    line = record.as_dict()
    assert set(line) == RECORD_KEYS
    assert (line["epoch"], line["images_per_sec"], line["data_wait_share"]) == (3, 50.0, 0.25)
    assert line["allreduce_share"] is None and line["steps"] == 10
    assert EpochRecord.from_dict(json.loads(json.dumps(line))) == record


def test_epoch_record_read_back_from_an_older_file_lacks_later_keys():
    older = {key: 1 for key in RECORD_KEYS - {"allreduce_bytes_per_step"}}
    assert EpochRecord.from_dict(older).allreduce_bytes_per_step is None


class CountingBackend:
    """Just what the step loop calls: a loader over a list, a step that counts its batches and
    (like torch's) says when it starts waiting for the all-reduce; it notes the phases seen."""

    marks_allreduce_wait = True
    allreduce_wait_hook = None

    def __init__(self):
        self.phases_seen, self.phases = [], None

    def loader(self, batches, workers):
        return iter(batches)

    def train_step(self, micro, lr, weight=1.0):
        self.phases_seen.append(self.phases.where.phase)
        self.allreduce_wait_hook()
        self.phases_seen.append(self.phases.where.phase)
        return Sums(1.0, 1.0, float(len(micro)))

    def allreduce_wait_seconds(self):
        return None


class Recorder(Callback):
    def __init__(self):
        self.before, self.after = [], []

    def before_step(self, trainer, epoch, step):
        self.before.append(step)

    def after_step(self, trainer, tally, sample):
        self.after.append(tally.steps)
        return False


class Samples(Sink):
    def __init__(self):
        self.samples = []

    def step(self, sample):
        self.samples.append(sample)


def test_step_loop_groups_times_tallies_and_calls_the_hook():
    config = cfg.load(overrides=["training.batch_size=2", "horovod.backward_passes_per_step=2"])
    ctx = Context("torch", 0, 1, 0, 1, "gloo", "cpu", 1)
    data = SimpleNamespace(train=[0] * 8, val=[], name="fake", augment={}, num_classes=2)
    sink = Samples()
    backend = CountingBackend()
    trainer = Trainer(config, backend, ctx, data, RunOutputs("unused", enabled=False),
                      Monitor([sink]))
    backend.phases = trainer.phases
    hook, times = Recorder(), EpochTimes()
    trainer.callbacks.append(hook)
    tally = trainer.run_steps(0, list(range(6)), 5, lambda i: 0.1 * (i + 1), times)
    assert (hook.before, hook.after) == ([5, 6, 7], [1, 2, 3])  # 6 micro-batches, 2 a step
    # the watchdog's view: computing, then waiting in the all-reduce, each step; then reading
    assert backend.phases_seen == [watchdog.COMPUTING, watchdog.ALLREDUCE] * 3
    assert (trainer.phases.where.phase, trainer.phases.where.step) == (watchdog.READING, 8)
    assert tally.steps == 3 and tally.total == Sums(3.0, 3.0, 6.0)
    assert tally.lr == pytest.approx(0.3)
    assert [(s.step, s.images) for s in sink.samples] == [(5, 4), (6, 4), (7, 4)]
    assert times.step == pytest.approx(sum(s.seconds for s in sink.samples))


def test_run_stops_after_the_epoch_that_reaches_the_target():
    """training.target_accuracy: the epoch at or above it is the last one trained."""
    config = cfg.load(overrides=["training.epochs=6", "training.target_accuracy=0.8", "training.batch_size=2",
                                 "output.checkpoint_every=0"])
    ctx = Context("torch", 0, 1, 0, 1, "gloo", "cpu", 1)
    data = SimpleNamespace(train=[0] * 8, val=[], name="fake", augment={}, num_classes=2)
    trainer = Trainer(config, CountingBackend(), ctx, data, RunOutputs("unused", enabled=False))
    accuracies = iter([0.5, 0.79, 0.8, 0.9, 0.95, 0.99])
    trainer.train_epoch = lambda epoch: (Reduced(1.0, 0.5, 8), 1.0, 0.1, EpochTimes())

    def end_epoch(epoch, train, lr, seconds, times, steps, started):
        val = Reduced(0.5, next(accuracies), 4)
        record = epoch_record(epoch, train, val, lr, seconds, seconds, times, 1, steps, wall_time=1.0)
        trainer.outputs.add_epoch(record)
        trainer.callbacks.validated(trainer, epoch, record)  # where the loop's end_epoch decides a stop
        return record

    trainer.end_epoch = end_epoch
    history = trainer.run(0, [])
    assert [r.val_accuracy for r in history] == [0.5, 0.79, 0.8]
    assert trainer.stopping and "0.8000 reached training.target_accuracy=0.8 after epoch 3" in trainer.stopping


def test_the_add_ons_are_callbacks_in_the_order_their_hooks_need():
    """The config picks the add-ons once; the EMA updates before elastic's commit would snapshot
    the weights, balancing (which may end a stretch of steps) follows both, and the target stop
    decides before the checkpoint cadence and the workers' choice read it."""
    from hvdcls.training import callbacks, elastic

    ctx = Context("torch", 0, 2, 0, 2, "gloo", "cpu", 1)
    data = SimpleNamespace(train=[0] * 8, val=[], name="fake", augment={}, num_classes=2)
    plain = Trainer(cfg.load(overrides=["training.batch_size=2"]), CountingBackend(), ctx, data,
                    RunOutputs("unused", enabled=False))
    assert [type(c) for c in plain.callbacks.items] == [callbacks.FaultHooks, callbacks.Checkpoints,
                                                         callbacks.WorkerChoice]
    config = cfg.load(overrides=["training.batch_size=2", "training.ema_decay=0.99", "training.profile_steps=1",
                                 "training.balance=dynamic", "training.target_accuracy=0.9",
                                 "training.freeze_epochs=1"])
    every = Trainer(config, CountingBackend(), ctx, data, RunOutputs("unused", enabled=False))
    assert [type(c) for c in every.callbacks.items] == [
        callbacks.FaultHooks, callbacks.Profiling, callbacks.ModelEma, callbacks.FrozenEpochs,
        callbacks.Rebalancing, callbacks.TargetStop, callbacks.Checkpoints, callbacks.WorkerChoice]
    commits = elastic.Commits(None, None, rank=0, per_step=4, commit_every=2, recoveries=elastic.Recoveries())
    every.callbacks.insert_before(callbacks.Rebalancing, commits)
    kinds = [type(c) for c in every.callbacks.items]
    assert kinds.index(callbacks.ModelEma) < kinds.index(elastic.Commits) == kinds.index(callbacks.Rebalancing) - 1
    plain.callbacks.insert_before(callbacks.Rebalancing, commits)  # no balancing: last
    assert plain.callbacks.items[-1] is commits
