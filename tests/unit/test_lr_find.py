"""optimizer.lr=auto: the range test's decisions (hvdcls.training.lr_find) on synthetic loss
curves, and its driver (hvdcls.training.lr_sweep) over a fake backend: the same steps, the
early stop, the restore, the conversion to optimizer.lr's units."""
import math

import numpy as np
import pytest

from hvdcls import config as cfg
from hvdcls.backend import Context, Sums
from hvdcls.training import lr_find, lr_sweep


def curve(losses_at, low=1e-5, high=10.0, steps=100):
    """A sweep as the driver runs it: smoothed, stopped at the first diverged point."""
    lrs = lr_find.rates(low, high, steps)
    smoothed = lr_find.smooth([losses_at(lr) for lr in lrs])
    return lrs[:len(smoothed)], smoothed


def valley(lr: float) -> float:
    """Falls from 2.3 as the rate grows, lowest near 0.3, back up past it (log-parabola)."""
    return 0.3 + 2.0 / (1 + (lr / 1e-2) ** 2) + 0.5 * max(0.0, math.log10(lr / 0.3)) ** 2


def test_the_rates_are_an_exponential_sweep_from_low_to_high():
    lrs = lr_find.rates(1e-5, 10.0, 100)
    assert len(lrs) == 100 and lrs[0] == 1e-5 and lrs[-1] == pytest.approx(10.0)
    ratios = np.array(lrs[1:]) / np.array(lrs[:-1])
    assert np.allclose(ratios, ratios[0]) and ratios[0] == pytest.approx(10 ** (6 / 99))


def test_smoothing_is_bias_corrected():
    assert lr_find.smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # no pull toward 0
    smoothed = lr_find.smooth([1.0, 0.0])
    assert smoothed[0] == 1.0 and 0.0 < smoothed[1] < 1.0


def test_a_clean_valley_gives_a_tenth_of_the_rate_at_the_smoothed_minimum():
    lrs, smoothed = curve(valley)
    choice = lr_find.choose(lrs, smoothed, fallback=0.05)
    assert choice.reason == "valley" and not choice.diverged
    at = int(np.argmin(smoothed))
    assert choice.at == at and choice.lr == pytest.approx(lrs[at] / 10)
    # the smoothed minimum lags the raw one a little (the average looks back), a tenth of it
    # lands on the steep descent, well below where the loss is lowest
    assert 0.1 < lrs[at] < 3.0 and choice.lr < 0.3


def test_a_diverging_tail_stops_the_sweep_and_is_no_candidate():
    def diverging(lr):  # a valley, then the loss explodes above 0.5
        return valley(min(lr, 0.5)) * (1 if lr < 0.5 else math.exp(20 * (lr - 0.5)))

    lrs, smoothed = curve(diverging)
    assert len(smoothed) < 100  # stopped early
    assert smoothed[-1] > lr_find.DIVERGED * min(smoothed[:-1])
    choice = lr_find.choose(lrs, smoothed, fallback=0.05)
    assert choice.diverged and choice.reason == "valley"
    assert choice.lr == pytest.approx(lrs[int(np.argmin(smoothed[:-1]))] / 10) and choice.lr < 0.5


def test_a_non_finite_loss_is_divergence():
    lrs, smoothed = curve(lambda lr: valley(lr) if lr < 1 else math.nan)
    assert math.isnan(smoothed[-1]) and lrs[-1] >= 1
    choice = lr_find.choose(lrs, smoothed, fallback=0.05)
    assert choice.diverged and choice.reason == "valley" and math.isfinite(choice.lr)


def test_a_flat_curve_takes_the_fallback():
    rng = np.random.default_rng(0)
    lrs, smoothed = curve(lambda lr: 2.3 + 0.01 * rng.standard_normal())
    assert len(smoothed) == 100
    choice = lr_find.choose(lrs, smoothed, fallback=0.05)
    assert (choice.lr, choice.reason, choice.diverged) == (0.05, "flat", False)


def test_diverging_before_any_descent_takes_the_smallest_rate():
    lrs, smoothed = curve(lambda lr: 2.3 * math.exp(min(3e4 * lr, 700)))
    choice = lr_find.choose(lrs, smoothed, fallback=0.05)
    assert (choice.lr, choice.reason, choice.diverged) == (1e-5, "diverged at once", True)


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


def test_the_driver_steps_at_each_rate_stops_on_divergence_and_restores(monkeypatch):
    config = cfg.load(overrides=["optimizer.lr=auto", "optimizer.lr_find.steps=60"])
    backend = CurveBackend()
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    before = backend.weights["w"].copy()
    resolved, account = lr_sweep.resolve(config, backend, context(), data=None)
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


def test_a_number_is_kept_and_no_step_is_taken():
    backend = CurveBackend()
    config = cfg.load(overrides=["optimizer.lr=0.2"])
    assert lr_sweep.resolve(config, backend, context(), data=None) == (config, None)
    assert backend.steps == [] and backend.snapshots == 0


def test_a_resumed_run_takes_its_checkpoints_rate_and_a_checkpoint_without_one_is_tested(monkeypatch):
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    config = cfg.load(overrides=["optimizer.lr=auto", "optimizer.lr_find.steps=20"])
    backend = CurveBackend()
    resolved, account = lr_sweep.resolve(config, backend, context(), None, None, {"epoch": 3, "lr": 0.35})
    assert resolved.optimizer.lr == 0.35 and account["resumed"] is True and account["steps"] == 0
    assert backend.steps == [] and backend.snapshots == 0
    for older in ({"epoch": 3}, {"epoch": 3, "lr": "auto"}, {"epoch": 3, "lr": True}):
        resolved, account = lr_sweep.resolve(config, backend, context(), None, None, older)
        assert "resumed" not in account and account["steps"] > 0, older  # the range test ran


def test_ranks_that_disagree_stop_the_run(monkeypatch):
    backend = CurveBackend()
    monkeypatch.setattr(backend, "allgather_object", lambda obj, name: [obj, [obj[0] * 2, obj[1]]])
    monkeypatch.setattr(lr_sweep, "batches", lambda *args: (step for step in [[("x", "y")]] * 1000))
    with pytest.raises(RuntimeError, match="chose differently"):
        lr_sweep.resolve(cfg.load(overrides=["optimizer.lr=auto"]), backend, context(), data=None)



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
    _, account = lr_sweep.resolve(cfg.load(overrides=["optimizer.lr=auto"]), backend, context(), data=None)
    assert account["curve"][-1][1:] == [None, None] and account["diverged"]
    json.loads(json.dumps(account, allow_nan=False))
