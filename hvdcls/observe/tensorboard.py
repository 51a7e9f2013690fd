"""TensorBoard scalars, written by the core for both backends (rank 0 only).

    tensorboard --logdir runs/            # every run's RUN_DIR/tensorboard/, side by side

One writer for torch and TensorFlow: the `tensorboard` package's record framing and
protobufs, which import neither framework (tensorboardX and torch.utils.tensorboard import
torch; tf.summary and tensorboard's EventFileWriter import TensorFlow). Event files are
append-only streams that TensorBoard reads while they grow, so unlike the run's other files they
are not written atomically.

Tags: step/loss, step/lr, step/images_per_sec (x = global step, when the loss was read);
epoch/<key> for every number of metrics.jsonl (x = epoch).
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Optional

from hvdcls.observe.monitor import RunInfo, Sink, StepSample

EPOCH_KEYS = ("train_loss", "val_loss", "train_accuracy", "val_accuracy", "lr", "images_per_sec",
              "data_wait_share", "allreduce_share", "epoch_seconds", "allreduce_bytes_per_step")
FLUSH_SECONDS = 10


class ScalarWriter:
    """The smallest writer of scalar summaries: one event file, written as it goes.

    Uses the tensorboard package's record framing and protobufs, not its EventFileWriter:
    that one opens files through `tensorboard.compat.tf`, which imports TensorFlow whenever it
    is installed, even in a torch run."""

    def __init__(self, logdir: Path):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        Path(logdir).mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = Path(logdir) / name
        self.records = RecordWriter(open(self.path, "wb"))  # noqa: SIM115 (closed in close())
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flushed = time.monotonic()

    def _write(self, event) -> None:
        self.records.write(event.SerializeToString())

    def add(self, scalars: dict[str, Optional[float]], step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                  for tag, value in scalars.items() if value is not None]
        if values:
            summary = summary_pb2.Summary(value=values)
            self._write(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        if time.monotonic() - self.flushed >= FLUSH_SECONDS:  # TensorBoard sees it while it runs
            self.records.flush()
            self.flushed = time.monotonic()

    def close(self) -> None:
        self.records.close()


class TensorBoardSink(Sink):
    def __init__(self, logdir: Path):
        self.logdir = Path(logdir)
        self.writer: Optional[ScalarWriter] = None
        self.images, self.seconds = 0, 0.0

    def start(self, info: RunInfo) -> None:
        self.info = info
        self.writer = ScalarWriter(self.logdir)

    def step(self, sample: StepSample) -> None:
        self.images += sample.images
        self.seconds += sample.seconds + sample.data_wait
        if sample.loss is None:  # only when the loss was read anyway (see monitor.LossReads)
            return
        assert self.writer is not None  # start() came first
        global_step = sample.epoch * self.info.steps_per_epoch + sample.step + 1
        self.writer.add({"step/loss": sample.loss, "step/lr": sample.lr,
                         "step/images_per_sec": self.images / self.seconds if self.seconds else None},
                        global_step)
        self.images, self.seconds = 0, 0.0

    def epoch(self, record: dict, history: list[dict]) -> None:
        assert self.writer is not None  # start() came first
        self.writer.add({f"epoch/{key}": record.get(key) for key in EPOCH_KEYS}, record["epoch"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
