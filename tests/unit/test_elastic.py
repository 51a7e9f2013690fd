"""hvdcls.training.elastic's framework-free parts: progress, seeds, the kill hook, recovery accounting."""
import signal
from collections import Counter
from types import SimpleNamespace

import pytest

from hvdcls.backend import Context
from hvdcls.errors import UserError
from hvdcls.observe.monitor import Monitor, Sink
from hvdcls.training import elastic, faults
from tests.unit.test_balance import SlowRankBackend


def test_initial_progress_starts_an_epoch_and_copies_history():
    history = [{"epoch": 1}]
    progress = elastic.initial_progress(1, history)
    assert (progress["epoch"], progress["consumed"], progress["global_step"]) == (1, 0, 0)
    assert progress["history"] == history and progress["history"] is not history


def test_attempt_seed_differs_by_point_in_the_epoch_and_rank():
    seeds = {elastic.attempt_seed(0, 1, rank, consumed) for rank in (0, 1) for consumed in (0, 64)}
    assert len(seeds) == 4
    assert elastic.attempt_seed(0, 1, 0, 64) == elastic.attempt_seed(0, 1, 0, 64)


def test_kill_hook_fires_once_on_its_rank_and_step(tmp_path, monkeypatch):
    killed = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: killed.append(sig))
    marker = tmp_path / "killed"
    environ = {faults.KILL: f"1:12:{marker}"}
    rank0, rank1 = (faults.StepHooks.read(rank, environ) for rank in (0, 1))
    rank0.kill_point(12)
    rank1.kill_point(11)
    assert killed == [] and not marker.exists()
    rank1.kill_point(12)
    assert killed == [signal.SIGKILL] and marker.exists()
    rank1.kill_point(12)  # a replacement worker reaching step 12 again lives
    assert killed == [signal.SIGKILL]
    faults.StepHooks.read(1, {}).kill_point(12)
    assert killed == [signal.SIGKILL]


def test_recoveries_count_lost_steps_and_the_gap(monkeypatch):
    clock = iter([10.0, 11.0, 20.0, 21.0])
    monkeypatch.setattr(elastic.time, "perf_counter", lambda: next(clock))
    ctx = Context("torch", 0, 1, 0, 1, "gloo", "cpu", 1)
    recoveries = elastic.Recoveries()
    recoveries.restarted(SimpleNamespace(global_step=0, epoch=0), ctx)
    recoveries.step_started()
    recoveries.step_done()  # t=10
    recoveries.step_done()  # t=11, then the world breaks; the state rolls back to step 1
    recoveries.restarted(SimpleNamespace(global_step=1, epoch=0), ctx)
    recoveries.step_started()  # t=20: 9 s without training
    recoveries.step_done()
    summary = recoveries.summary(SimpleNamespace(global_step=2), commit_every=1)
    assert summary["resets"] == 1 and summary["recoveries"][0]["seconds"] == pytest.approx(9.0)
    assert (summary["steps_run"], summary["steps_kept"], summary["steps_lost"]) == (3, 2, 1)


def elastic_trainer(config, world: int, num_samples: int, rank: int = 0, backend=None):
    """An elastic attempt's Trainer for rank `rank` of `world`, over `num_samples` fake samples
    whose loader hands the backend the indices."""
    from hvdcls.training.loop import Trainer
    from hvdcls.training.outputs import RunOutputs

    data = SimpleNamespace(train=list(range(num_samples)), val=[], name="fake", num_classes=10,
                           augment={"preset": "none"})
    ctx = Context("torch", rank, world, rank, world, "gloo", "cpu", 1)
    trainer = Trainer(config, backend or HalfSpeedLastRank(world), ctx, data,
                      RunOutputs("unused", enabled=False), Monitor([]))
    trainer.epoch_batches = lambda epoch, indices: indices
    return trainer


def test_learning_rate_follows_the_world_size_at_the_same_point_of_the_run():
    """Half the epoch done by 2 workers, then 1 takes over: the schedule stands at the same
    fraction of the run, and the linearly scaled peak halves."""
    from hvdcls import config as cfg

    config = cfg.load(overrides=["schedule.warmup_epochs=0", "training.epochs=4", "training.elastic=true"])
    two, one = (elastic_trainer(config, world, 1280) for world in (2, 1))
    consumed = 640
    at_two = elastic.schedule_position(1, consumed, two.elastic_shards)
    at_one = elastic.schedule_position(1, consumed, one.elastic_shards)
    assert at_two / (4 * two.steps_per_epoch) == at_one / (4 * one.steps_per_epoch) == 1.5 / 4
    lr_two, lr_one = two.lr_at(at_two), one.lr_at(at_one)
    assert lr_one == pytest.approx(lr_two / 2) and lr_one > 0


class Positions:
    """The schedule, noting every step position it is asked for."""

    def __init__(self, lr_at):
        self.lr_at, self.asked = lr_at, []

    def __call__(self, position):
        self.asked.append(position)
        return self.lr_at(position)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("num_samples, batch, passes", [(959, 32, 1), (1000, 32, 1), (1437, 16, 2),
                                                        (97, 8, 1), (200, 7, 3), (64, 16, 1)])
def test_an_elastic_run_counts_the_steps_its_batches_give(world, num_samples, batch, passes):
    """Schedule, EMA cadence, progress and checkpoint step all count by the trainer's
    steps_per_epoch; in elastic runs it is the ElasticShards' count, the batches actually
    read (no wrap-around padding), so the schedule is asked for steps 0 .. total - 1 exactly
    and ends on the run's last step."""
    from hvdcls import config as cfg
    from hvdcls.data.sharding import ElasticShards, TrainShards

    config = cfg.load(overrides=["training.elastic=true", "training.epochs=2", f"training.batch_size={batch}",
                                 f"horovod.backward_passes_per_step={passes}", "training.commit_every=4"])
    if num_samples // (world * batch * passes) < 1:
        with pytest.raises(UserError, match="too few for one step"):
            elastic_trainer(config, world, num_samples)
        return
    trainer = elastic_trainer(config, world, num_samples)
    shards = ElasticShards(num_samples, world, 0, batch, passes, config.training.seed)
    assert trainer.steps_per_epoch == shards.steps_per_epoch == len(shards.batches(0, 0)) // passes
    assert trainer.lr_at.steps_per_epoch == trainer.steps_per_epoch
    if (num_samples, world, batch) == (959, 3, 32):  # the padded count would be one more
        assert (trainer.steps_per_epoch, TrainShards(959, 3, 0, 32).steps_per_epoch) == (9, 10)
    trainer.lr_at = Positions(trainer.lr_at)
    state = FakeState()
    driver = elastic.ElasticTrainer(config, trainer.backend, trainer.data, None, Monitor([]), watchdog=None)
    for epoch in range(config.training.epochs):
        state.epoch, state.consumed, state.epoch_steps = epoch, 0, 0
        driver.train_rest_of_epoch(state, trainer)
        assert state.epoch_steps == trainer.steps_per_epoch
    total = trainer.lr_at.lr_at.total_steps
    assert trainer.lr_at.asked == list(range(total)) and state.global_step == total
    assert len(trainer.backend.read) == total


class FakeState:
    """The progress fields of the elastic state, and how often it was committed."""

    def __init__(self):
        self.__dict__.update(elastic.initial_progress(0, []))
        self.commits = 0

    def commit(self):
        self.commits += 1


class SummingBackend:
    """One rank: the sum over ranks is the values themselves."""

    def allreduce_sum(self, values, name):
        return list(values)


def test_commits_fold_every_commit_every_steps_and_leave_the_tail_to_fold():
    from hvdcls.backend import Sums
    from hvdcls.training.tallies import Tally

    state, recoveries = FakeState(), elastic.Recoveries()
    commits = elastic.Commits(state, SummingBackend(), rank=0, per_step=64, commit_every=2,
                              recoveries=recoveries)
    tally = Tally()
    for step in range(5):  # what Trainer.run_steps does around each step
        commits.before_step(None, 0, step)
        tally.add(Sums(0.5, 1.0, 2.0), lr=0.1 * step)
        assert commits.after_step(None, tally, None) is False  # never makes the batches stale
    assert (state.commits, state.global_step, tally.steps) == (2, 4, 1)
    commits.fold(tally)  # the epoch's last step, committed by the epoch's end
    assert (state.global_step, state.epoch_steps, state.consumed) == (5, 5, 5 * 64)
    assert state.train_sums == [2.5, 5.0, 10.0] and state.lr == pytest.approx(0.4)
    assert state.commits == 2 and recoveries.steps_run == 5


class FakeSink(Sink):
    def __init__(self, name: str, opened: list):
        self.name, self.opened = name, opened
        opened.append(name)

    def close(self) -> None:
        self.opened.remove(self.name)


def test_rank_zeros_watchers_follow_rank_zero_across_resets():
    """The first rank 0 holds the sinks; renumbered to rank 1 it closes them (the port is
    free), and becoming rank 0 again it makes new ones; rank 1 staying rank 1 does nothing."""
    opened, lines, made = [], [], []

    def make(metrics: bool):
        made.append(metrics)
        return [FakeSink(f"progress{len(made)}", opened)] + (
            [FakeSink(f"port{len(made)}", opened)] if metrics else [])

    monitor = Monitor(make(True))
    watchers = elastic.RankZeroWatchers(monitor, make, say=lines.append)
    rank = lambda r, size=2: Context("torch", r, size, 0, 1, "gloo", "cpu", 1)  # noqa: E731
    watchers.follow(rank(0))  # the first attempt: nothing changes
    assert opened == ["progress1", "port1"] and len(made) == 1 and lines == []
    watchers.follow(rank(1))
    assert opened == [] and monitor.sinks == [] and "rank 1 now" in lines[-1]
    watchers.follow(rank(1))
    assert opened == [] and len(made) == 1
    watchers.follow(rank(0, size=1))
    assert opened == ["progress2", "port2"] and monitor.sinks and made == [True, True]
    assert "took over the watchers (1 worker(s))" in lines[-1]


def test_a_new_rank_zero_waits_for_the_port_then_goes_on_without_it():
    """The port's last holder on this host closes it after the same sync: wait for it, a
    bounded time; a port never freed costs the endpoint, never the progress lines."""
    busy_for, lines, slept = [2], [], []

    def make(metrics: bool):
        if metrics and busy_for[0]:
            busy_for[0] -= 1
            raise UserError("--metrics-port 9400: cannot listen on 0.0.0.0:9400: in use")
        return ["progress", "port"] if metrics else ["progress"]

    watchers = elastic.RankZeroWatchers(Monitor([]), make, say=lines.append,
                                        port_wait_seconds=1.0, sleep=slept.append)
    watchers.follow(Context("torch", 0, 1, 0, 1, "gloo", "cpu", 1))
    assert watchers.monitor.sinks == ["progress", "port"] and len(slept) == 2
    watchers = elastic.RankZeroWatchers(Monitor([]), make, say=lines.append,
                                        port_wait_seconds=1.0, sleep=slept.append)
    busy_for[0] = 100
    watchers.follow(Context("torch", 0, 1, 0, 1, "gloo", "cpu", 1))
    assert watchers.monitor.sinks == ["progress"] and "without the metrics endpoint" in lines[-2]


class HalfSpeedLastRank(SlowRankBackend):
    """One rank's view of a world whose last rank computes at half the speed of the others:
    every exchange gathers the same numbers on every rank (on which the plan depends)."""

    def __init__(self, ranks: int):
        super().__init__()
        self.ranks = ranks

    def seed(self, value):
        pass

    def allreduce_sum(self, values, name):
        return list(values)

    def allgather_object(self, mine, name):
        return [(100, 1.0)] * (self.ranks - 1) + [(100, 2.0)]


def test_balanced_elastic_attempt_replans_for_its_world_and_reads_the_rest_of_the_epoch_once():
    """training.balance=dynamic after a reset: 3 ranks trained 2 steps of the epoch (48
    samples) and committed; the new world of 2 starts from equal batches, re-plans for its
    slow rank mid-epoch and trains the rest. Both ranks end with the same state and plans,
    read every remaining sample once together, and commit every 3 steps across the re-plan."""
    import copy
    from pathlib import Path

    from hvdcls import config as cfg
    from hvdcls.data.sharding import epoch_permutation
    from hvdcls.training.loop import Trainer
    from hvdcls.training.outputs import RunOutputs

    config = cfg.load(overrides=["training.elastic=true", "training.balance=dynamic", "training.batch_size=8",
                                 "training.balancing.every=2", "training.commit_every=3"])
    data = SimpleNamespace(train=list(range(200)), val=[], name="fake", num_classes=10,
                           augment={"preset": "none"})
    before = FakeState()
    before.consumed, before.global_step, before.epoch_steps = 48, 2, 2
    before.balance_plans = [{"step": 0, "batches": [8, 8, 8], "speeds": None}]
    states, backends = [], []
    for rank in (0, 1):
        state, backend = copy.deepcopy(before), HalfSpeedLastRank(2)
        ctx = Context("torch", rank, 2, rank, 2, "gloo", "cpu", 1)
        trainer = Trainer(config, backend, ctx, data, RunOutputs("unused", enabled=False),
                          Monitor([]), start_step=state.global_step)
        trainer.epoch_batches = lambda epoch, indices: indices  # the loader gets the indices
        elastic.record_plan(state, trainer)  # what an attempt does once it has begun
        elastic.ElasticTrainer(config, backend, data, Path("unused"), Monitor([]),
                               watchdog=None).train_rest_of_epoch(state, trainer)
        states.append(state)
        backends.append(backend)
    summary = elastic.balance_summary(trainer, state)  # the state's plans: every world's
    assert summary["plans"] == state.balance_plans and summary["batches"] == [11, 5]
    assert summary["plans"][0]["batches"] == [8, 8, 8] and summary["mode"] == "dynamic"
    first, second = states
    same = ("consumed", "global_step", "epoch_steps", "commits", "balance_plans")
    assert [getattr(first, k) for k in same] == [getattr(second, k) for k in same]
    assert first.train_sums[2] + second.train_sums[2] == 9 * 16  # samples (the fake sums no ranks)
    plans = first.balance_plans
    assert plans[1] == {"step": 2, "batches": [8, 8], "speeds": None}  # equal for the new world
    assert plans[2]["step"] == 7 and plans[2]["batches"] == [11, 5] and len(plans) == 3, plans
    assert (first.consumed, first.global_step, first.epoch_steps) == (48 + 9 * 16, 11, 11)
    assert first.commits == 3  # steps 3, 6, 9 of the attempt: the re-plan did not reset the clock
    read = Counter(int(i) for backend in backends for micro in backend.read for b in micro for i in b)
    order = epoch_permutation(200, config.training.seed, 0)
    assert max(read.values()) == 1 and sorted(read) == sorted(order[48:first.consumed].tolist())
    assert [len(m[0]) for m in backends[0].read] == [8] * 5 + [11] * 4
    assert backends[0].weights[-1] == pytest.approx(2 * 11 / 16)
