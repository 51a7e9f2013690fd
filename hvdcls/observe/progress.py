"""Progress on rank 0: a tqdm bar on a terminal, plain lines in a log, nothing when quiet.

    hvdcls train                      # a bar per epoch: step, loss, images/s, ETA of the run
    hvdcls train > train.log          # not a terminal: a line every training.log_every steps
    hvdcls train --quiet              # batch jobs: no step or epoch lines (start and end remain)

Under horovodrun every rank's output is collected, but only rank 0 gets a Progress sink
(hvdcls.observe.monitor), so there is one bar or one line stream, never one per rank.
"""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Optional, TextIO

from hvdcls.observe.monitor import RunInfo, Sink, StepSample

if TYPE_CHECKING:
    from tqdm import tqdm


def choose_mode(setting: str, stream: TextIO) -> str:
    """output.progress=auto -> bar on a terminal, lines otherwise."""
    if setting != "auto":
        return setting
    return "bar" if hasattr(stream, "isatty") and stream.isatty() else "lines"


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


def eta_seconds(steps_left: int, seconds_per_step: Optional[float], epochs_left_after_this: int,
                eval_seconds: Optional[float]) -> Optional[float]:
    """Time to the end of the run: the steps left at the pace so far, plus one evaluation for
    this epoch and each later one (at the pace of the evaluations so far, 0 before the first)."""
    if seconds_per_step is None:
        return None
    return steps_left * seconds_per_step + (epochs_left_after_this + 1) * (eval_seconds or 0.0)


def epoch_line(r: dict) -> str:
    line = (f"epoch {r['epoch']}: train loss {r['train_loss']:.4f} acc {r['train_accuracy']:.4f} | "
            f"val loss {r['val_loss']:.4f} acc {r['val_accuracy']:.4f} | lr {r['lr']:.4g} | "
            f"{r['images_per_sec']:.1f} img/s | {r['epoch_seconds']:.1f} s")
    if r.get("ema_val_accuracy") is not None:
        line += f" | EMA val loss {r['ema_val_loss']:.4f} acc {r['ema_val_accuracy']:.4f}"
    # where the step's time went that was not compute: the loader first (the usual culprit on a
    # GPU), then the all-reduce where the backend times it apart
    if r.get("data_wait_share") is not None:
        line += f" | data wait {100 * r['data_wait_share']:.1f} %"
    if r.get("allreduce_share") is not None:
        line += f" | all-reduce wait {100 * r['allreduce_share']:.1f} %"
    return line


class Pace:
    """Seconds per step and per evaluation so far in this run, for the ETA."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.steps_done, self.step_seconds, self.evals, self.eval_seconds = 0, 0.0, 0, 0.0
        self.epoch_images = 0
        self.epoch_started: Optional[float] = None  # None until the first start_epoch()
        self.last_step_end: float = 0.0

    def start_epoch(self) -> None:
        self.epoch_started = self.last_step_end = self.clock()
        self.epoch_images = 0

    def step(self, images: int) -> None:
        now = self.clock()
        self.step_seconds += now - self.last_step_end  # wall time, data waits included
        self.steps_done, self.last_step_end = self.steps_done + 1, now
        self.epoch_images += images

    def end_epoch(self, record: dict) -> None:
        self.evals += 1
        self.eval_seconds += max(0.0, record["epoch_seconds"] - record["train_seconds"])

    def images_per_second(self) -> float:
        if self.epoch_started is None:
            return 0.0
        elapsed = self.last_step_end - self.epoch_started
        return self.epoch_images / elapsed if elapsed > 0 else 0.0

    def eta(self, steps_left: int, epochs_left_after_this: int) -> Optional[float]:
        per_step = self.step_seconds / self.steps_done if self.steps_done else None
        per_eval = self.eval_seconds / self.evals if self.evals else None
        return eta_seconds(steps_left, per_step, epochs_left_after_this, per_eval)


class Progress(Sink):
    def __init__(self, mode: str, log_every: int, stream: TextIO = sys.stdout):
        self.mode, self.log_every, self.stream = mode, log_every, stream
        self.bar: Optional[tqdm] = None
        self.loss: Optional[float] = None
        self.pace = Pace()

    def start(self, info: RunInfo) -> None:
        self.info = info

    def _steps_left(self, sample: StepSample) -> tuple[int, int]:
        info = self.info
        epochs_after = info.epochs - sample.epoch - 1
        return info.steps_per_epoch - sample.step - 1 + epochs_after * info.steps_per_epoch, epochs_after

    def step(self, sample: StepSample) -> None:
        # A display made mid-epoch (a process that became rank 0 after an elastic reset) paces
        # from its first step.
        if sample.step == 0 or self.pace.epoch_started is None:
            self._start_epoch(sample.epoch, sample.step)
        self.pace.step(sample.images)
        self.loss = sample.loss if sample.loss is not None else self.loss
        if self.mode == "bar":
            self._update_bar(sample)
        elif self.mode == "lines" and (sample.step + 1) % self.log_every == 0:
            print(self._status(sample, with_step=True), file=self.stream, flush=True)

    def _start_epoch(self, epoch: int, first_step: int = 0) -> None:
        self.pace.start_epoch()
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=self.info.steps_per_epoch, initial=first_step,
                            desc=f"epoch {epoch + 1}/{self.info.epochs}",
                            unit="step", file=self.stream, dynamic_ncols=True, leave=False)

    def _status(self, sample: StepSample, with_step: bool) -> str:
        steps_left, epochs_after = self._steps_left(sample)
        loss = f"{self.loss:.4f}" if self.loss is not None else "?"
        where = (f"epoch {sample.epoch + 1}/{self.info.epochs} step {sample.step + 1}/"
                 f"{self.info.steps_per_epoch} " if with_step else "")
        return (f"{where}loss {loss} lr {sample.lr:.4g} {self.pace.images_per_second():.0f} img/s "
                f"eta {format_duration(self.pace.eta(steps_left, epochs_after))}")

    def _update_bar(self, sample: StepSample) -> None:
        assert self.bar is not None  # made when the epoch started
        self.bar.set_postfix_str(self._status(sample, with_step=False), refresh=False)
        self.bar.update(1)

    def epoch(self, record: dict, history: list[dict]) -> None:
        self.pace.end_epoch(record)
        self._close_bar()
        if self.mode != "quiet":
            print(epoch_line(record), file=self.stream, flush=True)

    def note(self, message: str) -> None:
        if self.mode != "quiet":
            print(message, file=self.stream, flush=True)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self._close_bar()
