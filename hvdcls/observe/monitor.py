"""What the engine tells the watchers of a run, and the fan-out to them (rank 0 only).

The engine measures each optimizer step once and hands a `StepSample` to one `Monitor`, which
passes it to its sinks: the progress display (hvdcls.observe.progress), the Prometheus endpoint
(hvdcls.observe.prometheus), TensorBoard (hvdcls.observe.tensorboard), report.png (hvdcls.observe.report)
and status.json (hvdcls.observe.status). Ranks
other than 0 get a Monitor with no sinks, so they print and serve nothing.

What each measured number means (all measured on rank 0, with the host's clock):
- seconds:   wall time of the backend's train_step (forward, backward, all-reduce, update).
             On a GPU this is host time; work still queued on the device is not in it.
- data_wait: time blocked waiting for the loader's next batch(es) before the step.
- allreduce: time the step blocked waiting for the all-reduced gradients after its backward
             pass, as the backend reports it (`Backend.allreduce_wait_seconds`); None where
             the backend cannot separate it (TensorFlow: see `hvdcls timeline` instead).
             Horovod overlaps most of the all-reduce with the backward pass; this is the part
             that was not hidden.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, fields
from typing import Optional

LOSS_READ_INTERVAL_SECONDS = 1.0  # reading a loss waits for the device: at most this often


@dataclass(frozen=True)
class RunInfo:
    backend: str
    model: str
    dataset: str
    world_size: int
    epochs: int
    steps_per_epoch: int
    start_epoch: int  # epochs already done (a resumed run)
    hosts: Optional[dict] = None  # ranks per host, as the launcher names them (None: not gathered)
    # The last epoch done before this start (its metrics.jsonl line; None on a fresh run): what a
    # resumed run reports as its latest metrics until it ends an epoch of its own, or for good
    # when the checkpoint already held every epoch.
    last_epoch: Optional[dict] = None


@dataclass(frozen=True)
class StepSample:
    epoch: int  # 0-based
    step: int  # 0-based, within the epoch
    images: int  # training images in this step, all ranks together
    seconds: float
    data_wait: float
    allreduce: Optional[float]
    lr: float
    loss: Optional[float]  # this step's mean loss on rank 0; None when not read this step


@dataclass(frozen=True)
class EpochRecord:
    """One epoch's result: one line of metrics.jsonl (as_dict), one entry of a checkpoint's
    history. Written by the engine (hvdcls.training); read back from files as plain dicts."""

    epoch: int  # 1-based: epochs done once this one is
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    lr: float  # the last step's learning rate
    images_per_sec: float  # training images over training seconds
    train_images: int
    val_images: int
    train_seconds: float
    epoch_seconds: float  # training, metric reduction and evaluation
    world_size: int
    steps: int
    data_wait_seconds: float
    data_wait_share: float
    step_seconds: float
    allreduce_wait_seconds: Optional[float]  # None: the backend cannot separate it
    allreduce_share: Optional[float]
    allreduce_bytes_per_step: Optional[float]  # None: the backend does not count
    ema_val_loss: Optional[float] = None  # the model EMA's (training.ema_decay); None: no EMA
    ema_val_accuracy: Optional[float] = None
    # training.balance: per-rank batches in force at the epoch's end, and the smoothed speeds
    # (images/s) that chose them; None with balance=off (and speeds with balance=fixed)
    balance_batches: Optional[list] = None
    balance_speeds: Optional[list] = None
    # rank 0's Unix time once the epoch's evaluation ended (time to a target accuracy is read
    # from it against the launch's start: hvdcls.bench.to_target); None in older records
    wall_time: Optional[float] = None
    # the share of validation images whose class is among the 5 highest logits; None with 5
    # classes or fewer (it would always be 1) and in older records
    val_top5: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> "EpochRecord":
        """A record read back (a checkpoint's history). One written by an earlier version may
        lack keys added since: they read as None, as unmeasured values do."""
        return cls(**{f.name: record.get(f.name) for f in fields(cls)})  # type: ignore[arg-type]


class Sink:
    """One watcher. Every method is optional; the Monitor calls them in order."""

    def start(self, info: RunInfo) -> None:
        pass

    def step(self, sample: StepSample) -> None:
        pass

    def epoch(self, record: dict, history: list[dict]) -> None:
        """`record` is the epoch's metrics.jsonl line, `history` every line so far: the
        form the files hold, which some sinks also read back from a run's directory."""

    def note(self, message: str) -> None:
        pass

    def phase(self, name: str) -> None:
        """The run enters a phase of hvdcls.files.status_file (evaluating, checkpointing, resetting)."""

    def failed(self, error: str) -> None:
        """The run ends with this one-line error (not called when it ends normally)."""

    def balance(self, batches: list[int], speeds: list[float]) -> None:
        """A new balancing plan: per-rank batches, and the speeds behind them (may be empty)."""

    def finish(self) -> None:
        """The run ended normally (not called when it failed)."""

    def close(self) -> None:
        pass


class Monitor:
    """Fans the engine's events out to its sinks; closes them all however the run ends."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = list(sinks)

    def start(self, info: RunInfo) -> None:
        for sink in self.sinks:
            sink.start(info)

    def step(self, sample: StepSample) -> None:
        for sink in self.sinks:
            sink.step(sample)

    def epoch(self, record: EpochRecord, history: list[EpochRecord]) -> None:
        line, lines = record.as_dict(), [r.as_dict() for r in history]
        for sink in self.sinks:
            sink.epoch(line, lines)

    def note(self, message: str) -> None:
        for sink in self.sinks:
            sink.note(message)

    def phase(self, name: str) -> None:
        for sink in self.sinks:
            sink.phase(name)

    def failed(self, error: str) -> None:
        for sink in self.sinks:
            sink.failed(error)

    def balance(self, batches: list[int], speeds: list[float]) -> None:
        for sink in self.sinks:
            sink.balance(batches, speeds)

    def finish(self) -> None:
        for sink in self.sinks:
            sink.finish()

    def close(self) -> None:
        with contextlib.ExitStack() as stack:  # every sink is closed even if one fails
            for sink in self.sinks:
                stack.callback(sink.close)

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LossReads:
    """When to turn the step's loss into a Python float: the first and last step of an epoch,
    every log_every-th step (a progress line shows it), and otherwise at most every
    LOSS_READ_INTERVAL_SECONDS, so a GPU is not made to wait for every step just to draw a bar."""

    def __init__(self, log_every: int, interval: float = LOSS_READ_INTERVAL_SECONDS):
        self.log_every, self.interval = log_every, interval
        self.last: Optional[float] = None

    def due(self, step: int, steps: int, now: float) -> bool:
        if (step in (0, steps - 1) or (step + 1) % self.log_every == 0 or self.last is None
                or now - self.last >= self.interval):
            self.last = now
            return True
        return False
