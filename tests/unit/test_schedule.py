"""hvdcls.training.schedule: linear scaling, warmup, cosine / step / multistep / constant decay."""
import math

import pytest

from hvdcls.config import OptimizerConfig, ScheduleConfig
from hvdcls.training import schedule


def make(name="cosine", *, lr=0.1, scale_lr="linear", world_size=1, backward_passes=1,
         steps_per_epoch=10, epochs=10, batch_size=32, **sched) -> schedule.LRSchedule:
    sched.setdefault("warmup_epochs", 0.0)
    return schedule.build(OptimizerConfig(lr=lr, scale_lr=scale_lr), ScheduleConfig(name=name, **sched),
                          world_size=world_size, backward_passes=backward_passes,
                          steps_per_epoch=steps_per_epoch, epochs=epochs, batch_size=batch_size)


# --- peak rate ----------------------------------------------------------------------------------

@pytest.mark.parametrize("world, passes, expected", [(1, 1, 0.1), (4, 1, 0.4), (4, 2, 0.8), (3, 5, 1.5)])
def test_linear_scaling(world, passes, expected):
    linear = OptimizerConfig(lr=0.1, scale_lr="linear")
    assert schedule.peak_lr(linear, world, passes, 32) == pytest.approx(expected, rel=1e-12)
    assert make(world_size=world, backward_passes=passes).peak == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("batch, world, passes, expected",
                         [(32, 1, 1, 0.0125), (32, 8, 1, 0.1), (64, 2, 2, 0.1), (256, 4, 1, 0.4)])
def test_default_scaling_is_per_256_images_of_the_global_batch(batch, world, passes, expected):
    assert OptimizerConfig().scale_lr == "per256"
    peak = schedule.peak_lr(OptimizerConfig(lr=0.1), world, passes, batch)
    assert peak == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("batch, world, expected", [(32, 8, 0.1), (64, 1, 0.05), (256, 4, 0.2), (16, 1, 0.025)])
def test_square_root_scaling_grows_with_the_root_of_the_global_batch(batch, world, expected):
    """sqrt: 0.1 per 256 images is 0.1 x sqrt(global / 256): 4x the batch, 2x the rate."""
    sqrt = OptimizerConfig(lr=0.1, scale_lr="sqrt")
    assert schedule.peak_lr(sqrt, world, 1, batch) == pytest.approx(expected, rel=1e-12)


def test_digits_peak_is_unchanged_bit_for_bit():
    """The demo's 0.05 per worker of 32 became 0.4 per 256: the same float at np=1 and 2."""
    for world in (1, 2, 4):
        assert schedule.peak_lr(OptimizerConfig(lr=0.4), world, 1, 32) == 0.05 * world


@pytest.mark.parametrize("epochs, expected", [(1, 0.1), (5, 0.5), (10, 1.0), (90, 1.0)])
def test_warmup_defaults_to_one_epoch_or_a_tenth_of_a_short_run(epochs, expected):
    assert schedule.warmup_epochs(ScheduleConfig(), epochs) == expected
    assert schedule.warmup_epochs(ScheduleConfig(warmup_epochs=0.0), epochs) == 0.0


@pytest.mark.parametrize("world, passes", [(1, 1), (8, 1), (8, 4)])
def test_no_scaling(world, passes):
    assert schedule.peak_lr(OptimizerConfig(lr=0.1, scale_lr="none"), world, passes, 32) == 0.1
    assert make("constant", scale_lr="none", world_size=world, backward_passes=passes)(37) == 0.1


def test_build_carries_its_arguments():
    lr = make("step", world_size=2, steps_per_epoch=7, epochs=3)
    assert (lr.peak, lr.steps_per_epoch, lr.epochs, lr.total_steps) == (0.2, 7, 3, 21)
    assert lr.config.name == "step"


# --- warmup -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["cosine", "step", "multistep", "constant"])
def test_warmup_ramps_linearly_to_peak(name):
    lr = make(name, world_size=4, steps_per_epoch=10, epochs=10, warmup_epochs=2,
              warmup_start_factor=0.25, milestones=[5])
    peak = 0.4
    assert lr.warmup_steps == 20
    assert lr(0) == pytest.approx(0.25 * peak, rel=1e-12)
    for step in range(20):
        assert lr(step) == pytest.approx(peak * (0.25 + 0.75 * step / 20), rel=1e-12)
    assert all(lr(s) < lr(s + 1) for s in range(19))
    assert lr(19) < peak
    assert lr(20) == pytest.approx(peak, rel=1e-12)  # the end of warmup is the peak


def test_warmup_start_factor_one_is_flat():
    lr = make("constant", warmup_epochs=1, warmup_start_factor=1.0)
    assert [lr(s) for s in range(15)] == [0.1] * 15


def test_fractional_warmup_epochs_round_to_steps():
    assert make(steps_per_epoch=10, warmup_epochs=0.5).warmup_steps == 5
    assert make(steps_per_epoch=4, warmup_epochs=0.0).warmup_steps == 0


def test_no_warmup_starts_at_peak():
    for name in ("cosine", "step", "multistep", "constant"):
        assert make(name, world_size=2)(0) == pytest.approx(0.2, rel=1e-12)


# --- cosine -------------------------------------------------------------------------------------

@pytest.mark.parametrize("floor", [0.0, 0.01, 0.2])
@pytest.mark.parametrize("warmup", [0, 1, 2.5])
def test_cosine_decays_to_floor(floor, warmup):
    lr = make("cosine", world_size=2, steps_per_epoch=8, epochs=10, warmup_epochs=warmup,
              min_lr_factor=floor)
    peak, total = 0.2, 80
    start = lr.warmup_steps
    after = [lr(s) for s in range(start, total + 1)]
    assert after[0] == pytest.approx(peak, rel=1e-12)
    assert all(a >= b for a, b in zip(after, after[1:])), "cosine must not rise after warmup"
    assert lr(total) == pytest.approx(floor * peak, abs=1e-12)
    assert lr(total + 100) == pytest.approx(floor * peak, abs=1e-12)  # clamped past the end
    assert min(after) >= floor * peak - 1e-12
    middle = start + (total - start) / 2
    if middle == int(middle):
        assert lr(int(middle)) == pytest.approx(peak * (floor + (1 - floor) * 0.5), rel=1e-12)


def test_cosine_exact_values():
    lr = make("cosine", lr=1.0, steps_per_epoch=4, epochs=2)  # 8 steps, no warmup
    for step in range(9):
        assert lr(step) == pytest.approx(0.5 * (1 + math.cos(math.pi * step / 8)), abs=1e-12)
    assert lr(8) == pytest.approx(0.0, abs=1e-12)


# --- step / multistep / constant ----------------------------------------------------------------

def test_step_decay():
    lr = make("step", lr=1.0, steps_per_epoch=5, epochs=10, step_size=3, gamma=0.5)
    by_epoch = [lr(epoch * 5 + 2) for epoch in range(10)]
    assert by_epoch == pytest.approx([1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125], rel=1e-12)
    assert lr(14) == 1.0 and lr(15) == 0.5  # the change happens at the first step of epoch 3


def test_multistep_decay():
    lr = make("multistep", lr=1.0, steps_per_epoch=4, epochs=10, milestones=[2, 5, 9], gamma=0.1)
    by_epoch = [lr(epoch * 4) for epoch in range(10)]
    assert by_epoch == pytest.approx([1, 1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01, 0.001], rel=1e-12)
    assert lr(7) == 1.0 and lr(8) == pytest.approx(0.1, rel=1e-12)


def test_multistep_without_milestones_is_constant():
    lr = make("multistep", steps_per_epoch=3, epochs=4)
    assert [lr(s) for s in range(12)] == [0.1] * 12


def test_step_decay_after_warmup_uses_the_epoch():
    lr = make("step", lr=1.0, steps_per_epoch=10, epochs=6, step_size=2, gamma=0.1,
              warmup_epochs=1, warmup_start_factor=0.5)
    assert lr(0) == 0.5
    assert lr(10) == 1.0 and lr(19) == 1.0
    assert lr(20) == pytest.approx(0.1, rel=1e-12)
    assert lr(40) == pytest.approx(0.01, rel=1e-12)


def test_constant():
    lr = make("constant", world_size=3, steps_per_epoch=6, epochs=5)
    assert {lr(s) for s in range(30)} == {lr.peak}
    assert lr.peak == pytest.approx(0.3, rel=1e-12)


def test_backends_build_their_optimizer_at_one_workers_rate():
    """torch's Horovod broadcast_optimizer_state steps once at it: it must stay what it was."""
    from hvdcls import config
    assert config.worker_lr(config.load().optimizer, 32) == 0.05  # the digits, bit for bit
    assert config.worker_lr(OptimizerConfig(lr=0.1), 32) == 0.0125
    assert config.worker_lr(OptimizerConfig(lr=0.1, scale_lr="linear"), 32) == 0.1


def test_worker_rate_is_the_peak_of_a_world_of_one_bit_for_bit():
    """worker_lr is peak_lr at one worker and one pass: lr x (batch / 256) is the float that
    lr x batch / 256 was (256 is a power of two), so no backend's optimizer moved."""
    from hvdcls import config
    for lr in (0.1, 0.4, 0.3, 1e-3, 0.0123456789, 2.5):
        for batch in (1, 3, 7, 24, 32, 96, 100, 333, 4096):
            opt = OptimizerConfig(lr=lr)
            assert config.worker_lr(opt, batch) == lr * batch / 256 == schedule.peak_lr(opt, 1, 1, batch)
            for scale in ("linear", "none"):
                assert config.worker_lr(OptimizerConfig(lr=lr, scale_lr=scale), batch) == lr
