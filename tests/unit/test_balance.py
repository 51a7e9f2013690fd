"""training.balance without a framework: the planner, the sharding it drives, the config checks
and the loop's re-planning (hvdcls/training/balance.py, hvdcls/data/sharding.py)."""
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from hvdcls import config as cfg
from hvdcls.backend import Context, Sums
from hvdcls.data.sharding import BalancedShards, TrainShards
from hvdcls.errors import UserError
from hvdcls.observe.monitor import Monitor, Sink
from hvdcls.training import balance
from hvdcls.training.balance import Balancer, Bounds, Plan, SpeedMeter, plan
from hvdcls.training.loop import EpochTimes, Trainer
from hvdcls.training.outputs import RunOutputs


def test_shares_are_proportional_to_speed():
    assert plan([2.0, 1.0], Bounds(48)) == [32, 16]
    assert plan([1.0, 1.0, 1.0, 1.0], Bounds(64)) == [16, 16, 16, 16]
    assert plan([3.0, 1.0], Bounds(64, quantum=8)) == [48, 16]


@pytest.mark.parametrize("seed", range(40))
def test_any_speeds_give_a_plan_that_sums_to_the_batch_within_bounds(seed):
    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(1, 7))
    quantum = int(rng.choice([1, 4, 8]))
    low = int(rng.integers(1, 9))
    total = int(rng.integers(ranks * low, ranks * 64 + 1))
    high = int(rng.integers(-(-total // ranks), total + 1))
    bounds = Bounds(total, low, high, quantum)
    assert bounds.problem(ranks) is None
    speeds = list(rng.uniform(0.01, 100.0, ranks))
    batches = plan(speeds, bounds)
    assert sum(batches) == total
    assert all(low <= b <= high for b in batches)
    assert plan(speeds, bounds) == batches  # deterministic: every rank computes the same
    # every batch but those at a bound is a multiple of the quantum, save one remainder
    free = [b for b in batches if low < b < high]
    assert sum(b % quantum != 0 for b in free) <= 1 + (total % quantum != 0)


def test_bounds_clip_and_the_rest_is_shared_out():
    assert plan([10.0, 1.0], Bounds(40, min_batch=8)) == [32, 8]
    assert plan([10.0, 1.0, 1.0], Bounds(60, max_batch=30)) == [30, 15, 15]


def test_quantum_rounds_and_the_remainder_lands_on_the_furthest_below():
    assert plan([1.0, 2.0], Bounds(60, quantum=8)) == [20, 40]  # 20 / 40 ideal: 16+4 / 40
    assert all(b % 8 == 0 for b in plan([1.0, 1.4], Bounds(64, quantum=8)))


def test_bounds_that_cannot_hold_the_batch_are_named():
    assert "min_batch=20" in Bounds(32, min_batch=20).problem(2)
    assert "max_batch=10" in Bounds(32, max_batch=10).problem(2)


def test_hysteresis_keeps_the_plan_until_the_gain_beats_the_threshold():
    settings = balance.Settings("dynamic", Bounds(64), threshold=0.1, smoothing=1.0)
    balancer = Balancer(settings, 2)
    assert balancer.plan.batches == (32, 32)
    assert balancer.observe([(320, 1.0), (300, 1.0)], next_step=5) is None  # ~3 %: kept
    assert balancer.observe([(320, 1.0), (160, 1.0)], next_step=10) is None  # once: maybe noise
    assert balancer.observe([(320, 1.0), (300, 1.0)], next_step=15) is None  # it was: kept
    assert balancer.observe([(320, 1.0), (160, 1.0)], next_step=20) is None  # rank 1 at half speed
    new = balancer.observe([(320, 1.0), (160, 1.0)], next_step=25)  # ... twice in a row
    assert new.batches == (43, 21) and new.step == 25 and balancer.plan is new
    assert balancer.observe([(430, 1.0), (215, 1.0)], next_step=30) is None  # balanced now
    assert [p.batches for p in balancer.history] == [(32, 32), (43, 21)]
    assert balancer.summary()["plans"][1] == {"step": 25, "batches": [43, 21], "speeds": [320.0, 160.0]}


def test_times_are_smoothed_and_an_empty_measurement_changes_nothing():
    balancer = Balancer(balance.Settings("dynamic", Bounds(64), threshold=0.0, smoothing=0.5), 2)
    balancer.observe([(100, 1.0), (100, 1.0)], 1)  # 0.32 s per pass of 32 on both
    balancer.observe([(100, 1.0), (50, 1.0)], 2)  # rank 1: 0.64 s, smoothed 0.48 s
    assert balancer.speeds == pytest.approx([100.0, 32 / 0.48])
    assert balancer.observe([(100, 1.0), (0, 0.0)], 3) is None
    assert balancer.speeds == pytest.approx([100.0, 32 / 0.48])


def true_seconds(batch, fixed, per_sample):
    return fixed + batch * per_sample


@pytest.mark.parametrize("ranks", [[(0.0, 0.01), (0.0, 0.02)], [(0.05, 0.01), (0.10, 0.02)],
                                   [(0.02, 0.002), (0.06, 0.006)],
                                   [(0.0, 0.01), (0.3, 0.01), (0.0, 0.03)]])
def test_replanning_settles_where_step_times_are_equal_even_with_a_fixed_cost_per_step(ranks):
    """Measured times from t(b) = fixed + b x per_sample: the plan settles near equal times in
    two re-plans (each after two exchanges that agree) and stays there (speed alone, images/s
    at one batch, gets there too, but one small step per re-plan where a rank has a fixed cost
    per step: 4 re-plans for the third case)."""
    n = len(ranks)
    balancer = Balancer(balance.Settings("dynamic", Bounds(32 * n), threshold=0.02, smoothing=1.0), n)
    for exchange in range(12):
        batches = balancer.plan.batches
        balancer.observe([(b, true_seconds(b, *r)) for b, r in zip(batches, ranks)], exchange)
    times = [true_seconds(b, *r) for b, r in zip(balancer.plan.batches, ranks)]
    assert max(times) - min(times) <= 2 * max(r[1] for r in ranks) + 1e-9  # within ~a sample or two
    assert len(balancer.history) <= 3  # settled at once, and no flapping


def test_the_weight_makes_the_average_of_local_means_the_global_mean():
    p = Plan((8, 24))
    local_sums = [np.arange(8.0).sum(), np.arange(8.0, 32.0).sum()]
    local_means = [s / b for s, b in zip(local_sums, p.batches)]
    averaged = np.mean([p.weight(r) * m for r, m in enumerate(local_means)])
    assert averaged == pytest.approx(np.arange(32.0).mean())
    assert Plan((16, 16)).weight(0) == 1.0


def test_the_meter_skips_the_first_step_and_leaves_out_the_allreduce_wait():
    meter = SpeedMeter(every=2)
    assert not meter.add(10, 5.0, None)  # the first step after a plan: not counted
    assert not meter.add(10, 1.0, 0.25)
    assert meter.add(10, 1.0, None)
    assert meter.take() == (20, 1.75)
    assert not meter.add(10, 1.0, None)  # counting again at once


@pytest.mark.parametrize("plans", [[(16, 16)], [(4, 28)], [(8, 24), (20, 12), (31, 1)]])
@pytest.mark.parametrize("num_samples,passes", [(200, 1), (203, 2), (97, 1)])
def test_balanced_shards_read_what_equal_batches_read_whatever_the_plans(plans, num_samples, passes):
    """The same steps, and in each step the same samples as TrainShards, split at the plan's
    offsets; a plan may change at any step."""
    equal = [TrainShards(num_samples, 2, r, 16, passes, seed=3) for r in range(2)]
    shards = [BalancedShards(num_samples, 2, r, 16, passes, seed=3) for r in range(2)]
    steps = equal[0].steps_per_epoch
    assert all(s.steps_per_epoch == steps for s in shards)
    changes = [0] + [steps * (k + 1) // len(plans) for k in range(len(plans) - 1)] + [steps]
    mine = [[], []]
    for p, first, stop in zip(plans, changes, changes[1:]):
        for r in range(2):
            got = shards[r].balanced_batches(1, p, first, stop)
            assert len(got) == (stop - first) * passes and all(len(b) == p[r] for b in got)
            mine[r] += got
    for step in range(steps * passes):  # per backward pass: the same samples, once each
        balanced = np.concatenate([mine[0][step], mine[1][step]])
        round_robin = np.concatenate([equal[0].batches(1)[step], equal[1].batches(1)[step]])
        assert sorted(balanced) == sorted(round_robin)
    read = Counter(int(i) for r in range(2) for b in mine[r] for i in b)
    assert max(read.values()) == 1 or num_samples % 2  # only wrap-around padding repeats
    assert sum(read.values()) == steps * passes * 32


def test_a_plan_that_does_not_split_the_batch_is_refused():
    with pytest.raises(ValueError):
        BalancedShards(100, 2, 0, 16).balanced_batches(0, (16, 15), 0)


def load(*overrides):
    return cfg.load(overrides=list(overrides))


@pytest.mark.parametrize("overrides,words", [
    (["training.balance=fixed"], "needs training.balancing.shares"),
    (["training.balancing.shares=[1,2]"], "shares are for balance=fixed"),
    (["training.balance=fixed", "training.balancing.shares=[1,0]"], "must be > 0"),
    (["training.balance=dynamic", "training.balancing.min_batch=8", "training.balancing.max_batch=4"],
     "must be >= training.balancing.min_batch"),
    (["training.balance=dynamic", "horovod.op=adasum"], "horovod.op=average"),
    (["training.balance=fixed", "training.balancing.shares=[2,1]", "training.elastic=true"],
     "the shares are one per rank and an elastic world changes size"),
    (["training.balance=dynamic", "training.balancing.smoothing=0"], "(0, 1]"),
    (["training.balance=sometimes"], "choose one of off, dynamic, fixed"),
])
def test_bad_balancing_config_is_one_line(overrides, words):
    with pytest.raises(UserError) as err:
        load(*overrides)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_dynamic_balancing_is_accepted_with_elastic_training():
    config = load("training.balance=dynamic", "training.elastic=true")
    assert (config.training.balance, config.training.elastic) == ("dynamic", True)


def test_shares_of_the_wrong_length_and_bounds_that_cannot_hold_the_batch_need_the_world():
    fixed = load("training.balance=fixed", "training.balancing.shares=[2,1]", "training.batch_size=8")
    assert balance.settings(fixed, 2, on_gpu=False).bounds == Bounds(16, 1, None, 1)
    with pytest.raises(UserError, match=r"2 shares for 3 ranks"):
        balance.settings(fixed, 3, on_gpu=False)
    tight = load("training.balance=dynamic", "training.batch_size=8", "training.balancing.max_batch=6")
    with pytest.raises(UserError, match="cannot hold the global batch 16"):
        balance.settings(tight, 2, on_gpu=False)
    assert balance.settings(fixed, 2, on_gpu=True).bounds.quantum == 8  # GPU default
    # a batch that is no multiple of 8 keeps equal batches equal: its largest divisor of 8
    twelve = load("training.balance=dynamic", "training.batch_size=12")
    bounds = balance.settings(twelve, 4, on_gpu=True).bounds
    assert bounds.quantum == 4 and plan([1.0] * 4, bounds) == [12] * 4
    off = load("training.batch_size=8", "training.balancing.max_batch=6")
    assert balance.settings(off, 2, on_gpu=False).mode == "off"  # bounds only matter when on


class SlowRankBackend:
    """Rank 0 of two: the other rank is reported at half this rank's speed; every step's
    micro-batches and weight are recorded."""

    marks_allreduce_wait = False  # the watchdog's phases: the step is one phase

    def __init__(self):
        self.read, self.weights, self.gathers = [], [], 0

    def loader(self, batches, workers):
        return iter(batches)

    def train_step(self, micro, lr, weight=1.0):
        self.read.append(micro)
        self.weights.append(weight)
        return Sums(1.0, 1.0, float(sum(len(m) for m in micro)))

    def allreduce_wait_seconds(self):
        return 0.0

    def allgather_object(self, obj, name):
        self.gathers += 1
        images, seconds = obj
        return [(images, 1.0), (images, 1.0 * 2 * images / 16)]  # rank 1: 16 images/s at 32


class Plans(Sink):
    def __init__(self):
        self.plans, self.notes = [], []

    def balance(self, batches, speeds):
        self.plans.append(batches)

    def note(self, message):
        self.notes.append(message)


def test_dynamic_balancing_replans_within_the_epoch_and_still_reads_each_step_once():
    config = load("training.balance=dynamic", "training.batch_size=16", "training.balancing.every=2")
    ctx = Context("torch", 0, 2, 0, 2, "gloo", "cpu", 1)
    data = SimpleNamespace(train=list(range(320)), val=[], name="fake", num_classes=10,
                           augment={"preset": "none"})
    backend, sink = SlowRankBackend(), Plans()
    trainer = Trainer(config, backend, ctx, data, RunOutputs("unused", enabled=False), Monitor([sink]))
    trainer.epoch_batches = lambda epoch, indices: indices  # the loader gets the indices
    trainer.begin(0, [])
    tally = trainer.run_balanced(0, lambda i: 0.1, EpochTimes())
    assert tally.steps == trainer.shards.steps_per_epoch == 10
    assert sink.plans[0] == [16, 16] and len(sink.plans) >= 2 and sink.plans[-1][0] > 16
    assert any("balance: per-rank batches" in n for n in sink.notes)
    sizes = [len(m[0]) for m in backend.read]
    assert sizes[:3] == [16, 16, 16] and sizes[-1] > 16  # re-planned mid-epoch
    assert set(sizes) <= {p[0] for p in sink.plans}  # each step read under a plan announced
    assert backend.weights[-1] == pytest.approx(2 * sizes[-1] / 32)
    offsets = Counter(int(i) for m in backend.read for i in m[0])
    assert max(offsets.values()) == 1  # rank 0 never reads a sample twice across plans



class WorldOfThree:
    """A backend whose world has 3 ranks and which must not be asked for any work."""

    name = "torch"

    def init(self, config):
        return Context("torch", 0, 3, 0, 3, "gloo", "cpu", 1)

    def __getattr__(self, name):
        raise AssertionError(f"{name} called: work started before the plan was checked")


def test_shares_that_do_not_fit_the_world_stop_the_cli_before_any_work(tmp_path, monkeypatch, capsys):
    from hvdcls import cli, registry
    from hvdcls.training import run

    monkeypatch.setattr(registry, "create_backend", lambda name: WorldOfThree())
    monkeypatch.setattr(run.horovod_env, "apply", lambda *args, **kwargs: {})
    out = tmp_path / "run"
    status = cli.main(["train", "--backend", "torch", "--output-dir", str(out),
                       "training.balance=fixed", "training.balancing.shares=[2,1]"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.strip().endswith("2 shares for 3 ranks (one per rank)") and not out.exists()


def test_a_bare_off_in_yaml_or_an_override_is_the_word_off(tmp_path):
    assert load("training.balance=off").training.balance == "off"
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  balance: off\n")
    assert cfg.load(path).training.balance == "off"
