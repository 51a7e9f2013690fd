"""hvdcls.observe.progress: the mode, the ETA arithmetic, and what each mode prints (rank 0's sink)."""
import io

import pytest

from hvdcls.observe.monitor import LossReads, RunInfo, StepSample
from hvdcls.observe.progress import Pace, Progress, choose_mode, eta_seconds, format_duration

INFO = RunInfo("torch", "compact_cnn", "digits", 2, epochs=2, steps_per_epoch=4, start_epoch=0)
RECORD = {"epoch": 1, "train_loss": 1.0, "train_accuracy": 0.5, "val_loss": 0.9, "val_accuracy": 0.6,
          "lr": 0.1, "images_per_sec": 100.0, "epoch_seconds": 2.0, "train_seconds": 1.5,
          "data_wait_share": 0.125, "allreduce_share": 0.25}


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_auto_is_a_bar_on_a_terminal_and_lines_elsewhere():
    assert choose_mode("auto", Terminal()) == "bar"
    assert choose_mode("auto", io.StringIO()) == "lines"
    assert choose_mode("quiet", Terminal()) == "quiet"


@pytest.mark.parametrize("seconds, text", [(None, "?"), (0, "0s"), (59.4, "59s"), (61, "1m01s"),
                                           (3725, "1h02m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_eta_counts_the_steps_and_evaluations_left():
    assert eta_seconds(10, 0.5, epochs_left_after_this=2, eval_seconds=1.0) == 10 * 0.5 + 3 * 1.0
    assert eta_seconds(10, 0.5, 2, None) == 5.0  # no evaluation measured yet
    assert eta_seconds(10, None, 2, 1.0) is None  # no step measured yet


def test_pace_from_a_fake_clock():
    ticks = iter([0.0, 1.0, 3.0])
    pace = Pace(clock=lambda: next(ticks))
    pace.start_epoch()
    pace.step(64)
    pace.step(64)
    assert pace.images_per_second() == pytest.approx(128 / 3)
    assert pace.eta(4, 0) == pytest.approx(4 * 1.5)
    pace.end_epoch(RECORD)
    assert pace.eta(4, 1) == pytest.approx(4 * 1.5 + 2 * 0.5)


def sample(step, epoch=0, loss=1.25):
    return StepSample(epoch, step, images=64, seconds=0.1, data_wait=0.01, allreduce=None, lr=0.1,
                      loss=loss)


def drive(progress):
    progress.start(INFO)
    for step in range(4):
        progress.step(sample(step))
    progress.epoch(RECORD, [RECORD])
    progress.note("checkpoint somewhere")
    progress.close()


def test_lines_every_log_every_steps_then_the_epoch():
    out = io.StringIO()
    drive(Progress("lines", log_every=2, stream=out))
    lines = out.getvalue().splitlines()
    assert [line.split(" loss")[0] for line in lines[:2]] == ["epoch 1/2 step 2/4", "epoch 1/2 step 4/4"]
    assert "loss 1.2500" in lines[0] and "img/s" in lines[0] and "eta" in lines[0]
    assert lines[2].startswith("epoch 1: train loss 1.0000")
    assert lines[2].endswith("| data wait 12.5 % | all-reduce wait 25.0 %")
    assert lines[3] == "checkpoint somewhere" and len(lines) == 4


@pytest.mark.parametrize("mode", ["lines", "bar"])
def test_a_display_made_mid_epoch_paces_from_its_first_step(mode):
    """A process that became rank 0 after an elastic reset makes its display mid-epoch: its
    first step is not step 0, and it must neither fail nor count time it did not see."""
    out = Terminal() if mode == "bar" else io.StringIO()
    progress = Progress(mode, log_every=1, stream=out)
    progress.start(INFO)
    for step in (2, 3):
        progress.step(sample(step))
    assert progress.pace.steps_done == 2
    progress.epoch(RECORD, [RECORD])
    progress.close()
    text = out.getvalue()
    assert "epoch 1/2" in text and "epoch 1: train loss 1.0000" in text
    if mode == "lines":
        assert [line.split(" loss")[0] for line in text.splitlines()[:2]] == ["epoch 1/2 step 3/4",
                                                                           "epoch 1/2 step 4/4"]


def test_quiet_prints_nothing():
    out = io.StringIO()
    drive(Progress("quiet", log_every=1, stream=out))
    assert out.getvalue() == ""


def test_bar_draws_a_tqdm_bar_and_keeps_the_epoch_line():
    out = Terminal()
    drive(Progress("bar", log_every=1, stream=out))
    text = out.getvalue()
    assert "epoch 1/2" in text and "\r" in text  # tqdm redraws in place
    assert "epoch 1: train loss 1.0000" in text


def test_loss_reads_first_last_and_log_steps():
    reads = LossReads(log_every=3, interval=1e9)
    due = [reads.due(step, 8, now=0.0) for step in range(8)]
    assert due == [True, False, True, False, False, True, False, True]
