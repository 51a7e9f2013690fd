"""hvdcls.training.elastic's framework-free parts: progress, seeds, the kill hook, recovery accounting."""
import signal
from types import SimpleNamespace

import pytest

from hvdcls.backend import Context
from hvdcls.errors import UserError
from hvdcls.observe.monitor import Monitor, Sink
from hvdcls.training import elastic, faults


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


def test_learning_rate_follows_the_world_size_at_the_same_point_of_the_run():
    """Half the epoch done by 2 workers, then 1 takes over: the schedule stands at the same
    fraction of the run, and the linearly scaled peak halves."""
    from hvdcls import config as cfg
    from hvdcls.data.sharding import ElasticShards

    config = cfg.load(overrides=["schedule.warmup_epochs=0", "training.epochs=4"])
    two, one = (ElasticShards(1280, world, 0, 32) for world in (2, 1))
    consumed = 640
    at_two = elastic.schedule_position(1, consumed, two)
    at_one = elastic.schedule_position(1, consumed, one)
    assert at_two / (4 * two.steps_per_epoch) == at_one / (4 * one.steps_per_epoch) == 1.5 / 4
    lr_two = elastic.world_schedule(config, two)(at_two)
    lr_one = elastic.world_schedule(config, one)(at_one)
    assert lr_one == pytest.approx(lr_two / 2) and lr_one > 0


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
    from hvdcls.training.loop import Tally

    state, recoveries = FakeState(), elastic.Recoveries()
    commits = elastic.Commits(state, SummingBackend(), rank=0, per_step=64, commit_every=2,
                              recoveries=recoveries)
    tally = Tally()
    for step in range(5):  # what Trainer.run_steps does around each step
        commits.before_step(step)
        tally.add(Sums(0.5, 1.0, 2.0), lr=0.1 * step)
        commits.after_step(tally)
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
