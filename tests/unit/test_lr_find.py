"""optimizer.lr=auto: the range test's decisions (hvdcls.training.lr_find) on synthetic loss
curves, and its driver (hvdcls.training.lr_sweep) over a fake backend: the same steps, the
early stop, the restore, the conversion to optimizer.lr's units."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from hvdcls import config as cfg
from hvdcls.backend import Context, Sums
from hvdcls.training import lr_find, lr_sweep


def curve(losses_at, low=1e-5, high=10.0, steps=100):
    """A sweep as the driver runs it: rates, step losses and their smoothing, stopped at the
    first diverged point."""
    lrs = lr_find.rates(low, high, steps)
    losses = [losses_at(lr) for lr in lrs]
    smoothed = lr_find.smooth(losses)
    return lrs[:len(smoothed)], losses[:len(smoothed)], smoothed


def valley(lr: float) -> float:
    """Falls from 2.3 as the rate grows, lowest near 0.3, back up past it (log-parabola)."""
    return 0.3 + 2.0 / (1 + (lr / 1e-2) ** 2) + 0.5 * max(0.0, math.log10(lr / 0.3)) ** 2


def noisy(losses_at, seed: int, spread: float = 0.15):
    """`losses_at` with each step's loss off by a seeded normal draw (a batch's noise: the
    measured sweeps on 50 images a class had 0.12-0.18 around their smoothed curve)."""
    rng = np.random.default_rng(seed)
    return lambda lr: losses_at(lr) + spread * rng.standard_normal()


def read_point(lrs, smoothed, start):
    """The rule by hand: the first rate whose smoothed loss made NEAR_BOTTOM of the descent."""
    bottom = min(smoothed[lr_find.SETTLE:])
    return next(i for i, v in enumerate(smoothed) if i >= lr_find.SETTLE
                and v <= start - lr_find.NEAR_BOTTOM * (start - bottom))


def test_the_rates_are_an_exponential_sweep_from_low_to_high():
    lrs = lr_find.rates(1e-5, 10.0, 100)
    assert len(lrs) == 100 and lrs[0] == 1e-5 and lrs[-1] == pytest.approx(10.0)
    ratios = np.array(lrs[1:]) / np.array(lrs[:-1])
    assert np.allclose(ratios, ratios[0]) and ratios[0] == pytest.approx(10 ** (6 / 99))


def test_smoothing_is_bias_corrected():
    assert lr_find.smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # no pull toward 0
    smoothed = lr_find.smooth([1.0, 0.0])
    assert smoothed[0] == 1.0 and 0.0 < smoothed[1] < 1.0


def test_a_clean_valley_is_read_where_the_descent_is_nearly_made():
    lrs, losses, smoothed = curve(valley)
    choice = lr_find.choose(lrs, losses, smoothed, fallback=0.05)
    assert choice.reason == "valley" and not choice.diverged and choice.shrink == 1.0
    assert choice.at == read_point(lrs, smoothed, start=np.mean(losses[:lr_find.SETTLE]))
    assert choice.lr == pytest.approx(lr_find.BELOW * lrs[choice.at])
    # on the steep side: below the smoothed minimum's rate, where the loss still falls fast
    lowest = int(np.argmin(smoothed))
    assert lrs[choice.at] < lrs[lowest] / 2 and smoothed[choice.at - 5] - smoothed[choice.at] > 0.1
    assert choice.noise is not None and choice.noise < 0.01  # no noise but the shape's


def test_a_dip_past_the_valley_is_not_read_as_its_bottom():
    """The issue's failure: a lucky stretch of batches after the loss turned up made the
    smoothed minimum (and a tenth of it, 3.0 per 256) lie far past the valley."""
    def valley_then(after):  # from 2.3 down to 1.0 by 0.1, up to 3.0 past 1, then `after`
        return lambda lr: 1.0 + 1.3 / (1 + (lr / 1e-2) ** 2) if lr < 1 else (3.0 if lr < 2 else after)

    lrs, losses, smoothed = curve(valley_then(0.0))  # a run of lucky batches past 2
    assert lrs[int(np.argmin(smoothed))] > 2.0  # the minimum is the dip: the old rule's pick
    choice = lr_find.choose(lrs, losses, smoothed, fallback=0.05)
    clean = lr_find.choose(*curve(valley_then(3.0)), fallback=0.05)
    assert (choice.lr, choice.at, choice.reason) == (clean.lr, clean.at, "valley") and choice.lr < 0.1


def test_noise_moves_the_choice_less_than_it_moves_the_minimum():
    """Thirty noisy sweeps of one curve: the rule's rates stay within a factor of two of each
    other, closer than the smoothed minimum's rates (which the old rule divided by ten)."""
    chosen, minima = [], []
    for seed in range(30):
        lrs, losses, smoothed = curve(noisy(valley, seed))
        chosen.append(lr_find.choose(lrs, losses, smoothed, fallback=0.05).lr)
        minima.append(lrs[int(np.argmin(smoothed[lr_find.SETTLE:])) + lr_find.SETTLE])
    assert max(chosen) / min(chosen) < 2.0
    assert max(minima) / min(minima) > 1.5 * max(chosen) / min(chosen)


def test_a_descent_lost_in_its_noise_takes_the_fallback():
    def shallow(lr):  # falls by 0.2 (9 % of 2.3) by 0.1, back up past 1
        return 2.3 - 0.2 / (1 + (lr / 1e-2) ** -2) + 0.5 * max(0.0, math.log10(lr))

    lrs, losses, smoothed = curve(noisy(shallow, seed=1, spread=0.6))
    choice = lr_find.choose(lrs, losses, smoothed, fallback=1e-4)
    assert choice.reason == "noisy" and choice.lr == 1e-4
    assert choice.noise * lr_find.NOISE_RATIO > 1
    # the same descent, measured cleanly, is read
    lrs, losses, smoothed = curve(shallow)
    assert lr_find.choose(lrs, losses, smoothed, fallback=1e-4).reason == "valley"


def test_a_short_schedule_shrinks_the_rate_in_proportion():
    lrs, losses, smoothed = curve(valley)
    long = lr_find.choose(lrs, losses, smoothed, 0.05, schedule_steps=lr_find.SHORT_STEPS)
    short = lr_find.choose(lrs, losses, smoothed, 0.05, schedule_steps=lr_find.SHORT_STEPS // 4)
    assert long.shrink == 1.0 and long.lr == lr_find.choose(lrs, losses, smoothed, 0.05).lr
    assert short.shrink == 0.25 and short.lr == pytest.approx(long.lr / 4) and short.at == long.at


def test_a_diverging_tail_stops_the_sweep_and_is_no_candidate():
    def diverging(lr):  # a valley, then the loss explodes above 0.5
        return valley(min(lr, 0.5)) * (1 if lr < 0.5 else math.exp(20 * (lr - 0.5)))

    lrs, losses, smoothed = curve(diverging)
    assert len(smoothed) < 100  # stopped early
    assert smoothed[-1] > lr_find.DIVERGED * min(smoothed[:-1])
    choice = lr_find.choose(lrs, losses, smoothed, fallback=0.05)
    assert choice.diverged and choice.reason == "valley" and choice.at < len(smoothed) - 1
    assert choice.lr == pytest.approx(lr_find.BELOW * lrs[choice.at]) and choice.lr < 0.5


def test_a_non_finite_loss_is_divergence():
    lrs, losses, smoothed = curve(lambda lr: valley(lr) if lr < 1 else math.nan)
    assert math.isnan(smoothed[-1]) and lrs[-1] >= 1
    choice = lr_find.choose(lrs, losses, smoothed, fallback=0.05)
    assert choice.diverged and choice.reason == "valley" and math.isfinite(choice.lr)


def test_a_flat_curve_takes_the_fallback():
    lrs, losses, smoothed = curve(noisy(lambda lr: 2.3, seed=0, spread=0.01))
    assert len(smoothed) == 100
    choice = lr_find.choose(lrs, losses, smoothed, fallback=0.05)
    assert (choice.lr, choice.reason, choice.diverged) == (0.05, "flat", False)


def test_diverging_before_any_descent_takes_the_smallest_rate():
    lrs, losses, smoothed = curve(lambda lr: 2.3 * math.exp(min(3e4 * lr, 700)))
    choice = lr_find.choose(lrs, losses, smoothed, fallback=0.05)
    assert (choice.lr, choice.reason, choice.diverged) == (1e-5, "diverged at once", True)


def test_a_short_sweep_settles_sooner():
    """The parallel tests sweep 12 steps: the start level is then a quarter of them."""
    lrs, losses, smoothed = curve(valley, low=1e-3, high=10.0, steps=12)
    found = lr_find.valley(losses, smoothed)
    assert found is not None and found.first == 3 and found.start == pytest.approx(np.mean(losses[:3]))
    assert lr_find.choose(lrs, losses, smoothed, fallback=0.05).reason == "valley"


def test_the_table_keeps_every_nth_point_and_the_last():
    rows = lr_find.table([0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 0.9, 0.8, 0.7, 0.6], every=2)
    assert rows == [["0.1", "1.0000"], ["0.3", "0.8000"], ["0.5", "0.6000"]]


class CurveBackend:
    """A fake backend whose step loss depends on its rate alone (valley), which counts what the
    driver asks of it; two ranks that see the same global sums."""

    name = "fake"

    def __init__(self, size=2):
        self.steps, self.reduced, self.snapshots, self.restored = [], [], 0, None
        self.weights = {"w": np.arange(4.0)}
        self.size = size

    def snapshot(self):
        self.snapshots += 1
        return {"w": self.weights["w"].copy()}

    def restore(self, saved):
        self.restored = saved
        self.weights = {"w": saved["w"].copy()}

    def train_step(self, micro, lr, weight=1.0):
        self.steps.append(lr)
        self.weights["w"] += lr  # the sweep moves the weights
        return Sums(valley(lr) * 32, 3, 32)

    def allreduce_sum(self, values, name):
        self.reduced.append(name)
        return [v * self.size for v in values]  # every rank contributed the same

    def allgather_object(self, obj, name):
        return [obj] * self.size


def context(size=2) -> Context:
    return Context("fake", 0, size, 0, size, "gloo", "cpu", 1)


# What the driver reads of the data besides its batches: the training split's length, for the
# schedule's steps (640 images, 2 ranks x 32: 10 steps an epoch).
DATA = SimpleNamespace(train=[None] * 640)


def test_the_driver_steps_at_each_rate_stops_on_divergence_and_restores(monkeypatch):
    config = cfg.load(overrides=["optimizer.lr=auto", "optimizer.lr_find.steps=60"])
    backend = CurveBackend()
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    before = backend.weights["w"].copy()
    resolved, account = lr_sweep.resolve(config, backend, context(), DATA)
    assert backend.snapshots == 1 and np.array_equal(backend.weights["w"], before)
    planned = lr_find.rates(1e-5, 10.0, 60)
    assert backend.steps == planned[:len(backend.steps)] and len(backend.steps) <= 60
    assert backend.reduced == [f"lr_find.{i}" for i in range(len(backend.steps))]
    # the global mean loss: sums over ranks / counts over ranks
    assert account["curve"][0][1] == pytest.approx(valley(1e-5))
    assert account["reason"] == "valley" and account["rank_choices"] == [[account["lr"], account["steps"]]] * 2
    # the choice is a step rate; optimizer.lr takes it per 256 images: 2 ranks x 32 = 64
    assert resolved.optimizer.lr == pytest.approx(account["lr"] * 256 / 64) == account["config_lr"]
    assert cfg.peak_lr(resolved.optimizer, 2, 1, 32) == pytest.approx(account["lr"])
    assert config.optimizer.lr == "auto"  # the given config is not changed
    assert account["shrink"] == 1.0 and account["read_at"] < account["steps"]  # 10 epochs x 10 steps


def test_the_driver_shrinks_the_rate_for_a_short_schedule(monkeypatch):
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    found = {}
    for epochs in (10, 3):  # 100 steps, then 30: under SHORT_STEPS
        config = cfg.load(overrides=["optimizer.lr=auto", "optimizer.lr_find.steps=60",
                                     f"training.epochs={epochs}"])
        found[epochs] = lr_sweep.resolve(config, CurveBackend(), context(), DATA)[1]
    assert found[10]["shrink"] == 1.0 and found[3]["shrink"] == pytest.approx(30 / lr_find.SHORT_STEPS)
    assert found[3]["lr"] == pytest.approx(found[10]["lr"] * found[3]["shrink"])


def test_a_number_is_kept_and_no_step_is_taken():
    backend = CurveBackend()
    config = cfg.load(overrides=["optimizer.lr=0.2"])
    assert lr_sweep.resolve(config, backend, context(), DATA) == (config, None)
    assert backend.steps == [] and backend.snapshots == 0


def test_a_resumed_run_takes_its_checkpoints_rate_and_a_checkpoint_without_one_is_tested(monkeypatch):
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    config = cfg.load(overrides=["optimizer.lr=auto", "optimizer.lr_find.steps=20"])
    backend = CurveBackend()
    resolved, account = lr_sweep.resolve(config, backend, context(), DATA, None, {"epoch": 3, "lr": 0.35})
    assert resolved.optimizer.lr == 0.35 and account["resumed"] is True and account["steps"] == 0
    assert backend.steps == [] and backend.snapshots == 0
    for older in ({"epoch": 3}, {"epoch": 3, "lr": "auto"}, {"epoch": 3, "lr": True}):
        resolved, account = lr_sweep.resolve(config, backend, context(), DATA, None, older)
        assert "resumed" not in account and account["steps"] > 0, older  # the range test ran


def test_ranks_that_disagree_stop_the_run(monkeypatch):
    backend = CurveBackend()
    monkeypatch.setattr(backend, "allgather_object", lambda obj, name: [obj, [obj[0] * 2, obj[1]]])
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    with pytest.raises(RuntimeError, match="chose differently"):
        lr_sweep.resolve(cfg.load(overrides=["optimizer.lr=auto"]), backend, context(), DATA)



def test_the_backend_builds_with_the_default_rate_standing_in_for_auto():
    auto = cfg.load(overrides=["optimizer.lr=auto"]).optimizer
    assert cfg.worker_lr(auto, 32) == cfg.DEFAULT_LR * 32 / 256 == lr_sweep.FALLBACK_LR / 8
    with pytest.raises(ValueError, match="not resolved"):  # the schedule needs the real one
        cfg.peak_lr(auto, 2, 1, 32)


def test_a_non_finite_loss_is_null_in_the_account(monkeypatch):
    import json

    backend = CurveBackend()
    monkeypatch.setattr(backend, "train_step", lambda micro, lr, weight=1.0: Sums(
        valley(lr) * 32 if lr < 1 else math.inf, 3, 32))
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    _, account = lr_sweep.resolve(cfg.load(overrides=["optimizer.lr=auto"]), backend, context(), DATA)
    assert account["curve"][-1][1:] == [None, None] and account["diverged"]
    json.loads(json.dumps(account, allow_nan=False))
