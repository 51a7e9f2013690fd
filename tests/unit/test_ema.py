"""hvdcls.training.ema: torchvision's decay scaling, the update cadence, warmup, the update maths;
bad values are one line; the epoch line shows the EMA's validation."""
import numpy as np
import pytest

from hvdcls import config
from hvdcls.errors import UserError
from hvdcls.observe.progress import epoch_line
from hvdcls.training import ema


def schedule(decay=0.99998, every=32, images=1024, epochs=600, warmup=5.0) -> ema.EmaSchedule:
    return ema.EmaSchedule(decay, every, images, epochs, warmup)


def test_decay_is_scaled_as_torchvisions_reference_scales_it():
    # torchvision's ResNet-50 v2 recipe: 8 x 128 images, --model-ema-steps 32, 600 epochs
    assert schedule().per_update == pytest.approx(1 - 2e-5 * 1024 * 32 / 600, rel=1e-12)
    assert schedule(decay=0.5, images=64).per_update == 0.0  # alpha clamped at 1: a plain copy
    # the same decay spans the same share of the run at any global batch
    small, large = schedule(decay=0.9999, images=64, every=1, epochs=10), schedule(decay=0.9999, images=128, every=1, epochs=10)
    assert np.log(small.per_update) * 2 == pytest.approx(np.log(large.per_update), rel=1e-3)


def test_update_cadence_and_warmup():
    every3 = schedule(every=3)
    assert [s for s in range(10) if every3.due(s)] == [2, 5, 8]
    assert [schedule(warmup=2).decay_at(e) for e in (0, 1)] == [0.0, 0.0]
    assert schedule(warmup=2).decay_at(2) == schedule().per_update
    assert schedule(warmup=0.5).decay_at(0) == 0.0 and schedule(warmup=0.5).decay_at(1) > 0


def test_schedule_follows_the_config():
    assert ema.schedule_for(config.load(), 64) is None
    cfg = config.load(overrides=["training.ema_decay=0.999", "training.ema_steps=4", "training.epochs=5"])
    made = ema.schedule_for(cfg, 64)
    assert (made.decay, made.every, made.images_per_step, made.epochs) == (0.999, 4, 64, 5)
    assert made.warmup_epochs == 1.0  # the digits' warmup
    unset = config.load(overrides=["data.name=synthetic", "training.ema_decay=0.999", "training.epochs=5"])
    assert ema.schedule_for(unset, 64).warmup_epochs == 0.5  # the default: a tenth of a short run


def test_update_maths():
    rng = np.random.default_rng(0)
    start, weights = {"w": rng.normal(size=5)}, {"w": rng.normal(size=5)}
    assert np.array_equal(ema.update(start, weights, 0.0)["w"], weights["w"])
    averaged = start
    for _ in range(7):
        averaged = ema.update(averaged, weights, 0.9)
    assert np.allclose(averaged["w"], 0.9 ** 7 * start["w"] + (1 - 0.9 ** 7) * weights["w"])
    assert np.allclose(ema.update(weights, weights, 0.3)["w"], weights["w"])  # a fixed point


@pytest.mark.parametrize("overrides, key", [
    (["training.ema_decay=0"], "training.ema_decay"), (["training.ema_decay=1"], "training.ema_decay"),
    (["training.ema_decay=1.5"], "training.ema_decay"), (["training.ema_decay=-0.1"], "training.ema_decay"),
    (["training.ema_steps=0"], "training.ema_steps"),
    (["training.ema_decay=0.99", "training.elastic=true"], "training.elastic")])
def test_bad_ema_values_are_one_line(overrides, key):
    with pytest.raises(UserError) as info:
        config.load(overrides=overrides)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_epoch_line_shows_the_ema_only_when_there_is_one():
    record = {"epoch": 1, "train_loss": 1.0, "train_accuracy": 0.5, "val_loss": 0.8, "val_accuracy": 0.6,
              "lr": 0.1, "images_per_sec": 10.0, "epoch_seconds": 1.0}
    assert "EMA" not in epoch_line(record)
    assert "EMA val loss 0.7000 acc 0.6500" in epoch_line({**record, "ema_val_loss": 0.7, "ema_val_accuracy": 0.65})
