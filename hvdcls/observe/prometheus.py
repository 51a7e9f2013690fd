"""`--metrics-port PORT`: rank 0 serves the run's numbers to Prometheus (prometheus-client).

    hvdcls train --metrics-port 9400          # http://HOST:9400/metrics
    hvdcls train --metrics-port 0             # any free port; the chosen one is logged

Every sample carries the labels backend and model. The numbers are kept in one `RunState`
the engine updates, and turned into metrics when scraped, so a value the backend cannot
measure (TensorFlow's all-reduce wait) is absent rather than a made-up 0. See hvdcls.observe.monitor
for what each measured time means; docs/watching.md lists the metrics.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator, Optional

from hvdcls.errors import UserError
from hvdcls.observe.monitor import RunInfo, Sink, StepSample

PREFIX = "hvdcls_"


@dataclass
class RunState:
    """The latest numbers of the run; written by the training thread, read by scrapes."""

    world_size: int = 0
    epochs: int = 0
    epoch: int = 0  # epochs completed
    steps_total: int = 0
    images_total: int = 0
    step_seconds_total: float = 0.0
    data_wait_seconds_total: float = 0.0
    allreduce_wait_seconds_total: Optional[float] = None
    step_seconds: Optional[float] = None
    data_wait_seconds: Optional[float] = None
    allreduce_wait_seconds: Optional[float] = None
    allreduce_share: Optional[float] = None  # of this epoch's training time so far
    images_per_second: Optional[float] = None  # this epoch so far, all ranks
    learning_rate: Optional[float] = None
    train_loss: Optional[float] = None  # the latest read step loss
    val_loss: Optional[float] = None
    train_accuracy: Optional[float] = None
    val_accuracy: Optional[float] = None
    done: bool = False
    balance_batches: Optional[list] = None  # training.balance: per rank
    balance_speeds: Optional[list] = None


def one(field_name: str) -> list[tuple[str, dict]]:
    return [(field_name, {})]


# Per-rank gauges (label rank), from RunState lists: (name, help, RunState field)
PER_RANK = [
    ("balance_batch", "training.balance: this rank's batch per backward pass in the plan in force",
     "balance_batches"),
    ("balance_speed", "training.balance: this rank's smoothed compute speed, images/s",
     "balance_speeds"),
]

# (name as exposed, type, help, [(RunState field, extra labels), ...])
METRICS = [
    ("images_per_second", "gauge", "Training images per second, all ranks, this epoch so far",
     one("images_per_second")),
    ("images_total", "counter", "Training images processed, all ranks", one("images_total")),
    ("steps_total", "counter", "Optimizer steps done", one("steps_total")),
    ("last_step_seconds", "gauge", "Wall time of the last step's train_step on rank 0",
     one("step_seconds")),
    ("step_seconds_total", "counter", "Summed train_step wall time on rank 0",
     one("step_seconds_total")),
    ("last_data_wait_seconds", "gauge", "Time the last step waited for the data loader on rank 0",
     one("data_wait_seconds")),
    ("data_wait_seconds_total", "counter", "Summed data loader wait on rank 0",
     one("data_wait_seconds_total")),
    ("last_allreduce_wait_seconds", "gauge", "Time the last step blocked on the gradient "
     "all-reduce after backward, rank 0 (absent where the backend cannot separate it)",
     one("allreduce_wait_seconds")),
    ("allreduce_wait_seconds_total", "counter", "Summed all-reduce wait on rank 0",
     one("allreduce_wait_seconds_total")),
    ("allreduce_share", "gauge", "All-reduce wait / training wall time, this epoch so far",
     one("allreduce_share")),
    ("loss", "gauge", "Loss: train = the latest step's on rank 0, val = the last epoch's",
     [("train_loss", {"split": "train"}), ("val_loss", {"split": "val"})]),
    ("accuracy", "gauge", "Accuracy of the last epoch, reduced over ranks",
     [("train_accuracy", {"split": "train"}), ("val_accuracy", {"split": "val"})]),
    ("learning_rate", "gauge", "Learning rate of the last step", one("learning_rate")),
    ("world_size", "gauge", "Horovod ranks", one("world_size")),
    ("epoch", "gauge", "Epochs completed", one("epoch")),
    ("epochs", "gauge", "Epochs the run will train", one("epochs")),
    ("training_done", "gauge", "1 once training has finished", one("done")),
]


class RunCollector:
    """A prometheus-client collector reading RunState at scrape time; it also notes scrapes
    that happen after the run is done (see PrometheusSink.finish)."""

    def __init__(self, state: RunState, labels: dict[str, str]):
        self.state, self.labels = state, labels
        self.scraped_when_done = threading.Event()

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        done = self.state.done
        for name, kind, help_text, samples in METRICS:
            extra = sorted({key for _, labels in samples for key in labels})
            family: CounterMetricFamily | GaugeMetricFamily
            if kind == "counter":  # prometheus-client adds the _total itself
                family = CounterMetricFamily(PREFIX + name.removesuffix("_total"), help_text,
                                             labels=[*self.labels, *extra])
            else:
                family = GaugeMetricFamily(PREFIX + name, help_text, labels=[*self.labels, *extra])
            for field_name, labels in samples:
                value = getattr(self.state, field_name)
                if value is not None:
                    family.add_metric([*self.labels.values(), *(labels[k] for k in extra)], float(value))
            yield family
        yield from self.per_rank()
        if done:
            self.scraped_when_done.set()


    def per_rank(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily

        for name, help_text, field_name in PER_RANK:
            values = getattr(self.state, field_name)
            if values:  # absent until a plan exists (balance=off: never)
                family = GaugeMetricFamily(PREFIX + name, help_text, labels=[*self.labels, "rank"])
                for rank, value in enumerate(values):
                    family.add_metric([*self.labels.values(), str(rank)], float(value))
                yield family


class PrometheusSink(Sink):
    def __init__(self, port: int, host: str, labels: dict[str, str], linger_seconds: float = 0.0):
        from prometheus_client import CollectorRegistry, start_http_server

        self.state = RunState()
        self._epoch_seconds, self._epoch_images = 0.0, 0
        self._epoch_allreduce: Optional[float] = None
        self.collector = RunCollector(self.state, labels)
        self.linger_seconds = linger_seconds
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        try:
            self.server, self.thread = start_http_server(port, host, registry=registry)
        except OSError as err:
            raise UserError(f"--metrics-port {port}: cannot listen on {host}:{port}: "
                            f"{err.strerror or err}") from None
        self.port = self.server.server_port

    def start(self, info: RunInfo) -> None:
        self.state.world_size, self.state.epochs, self.state.epoch = \
            info.world_size, info.epochs, info.start_epoch

    def step(self, sample: StepSample) -> None:
        s = self.state
        if sample.step == 0:
            self._epoch_seconds, self._epoch_images, self._epoch_allreduce = 0.0, 0, None
        s.steps_total += 1
        s.images_total += sample.images
        s.step_seconds, s.data_wait_seconds = sample.seconds, sample.data_wait
        s.step_seconds_total += sample.seconds
        s.data_wait_seconds_total += sample.data_wait
        s.learning_rate = sample.lr
        if sample.loss is not None:
            s.train_loss = sample.loss
        self._epoch_seconds += sample.seconds + sample.data_wait
        self._epoch_images += sample.images
        s.images_per_second = self._epoch_images / self._epoch_seconds if self._epoch_seconds > 0 else None
        s.allreduce_wait_seconds = sample.allreduce
        if sample.allreduce is not None:
            s.allreduce_wait_seconds_total = (s.allreduce_wait_seconds_total or 0.0) + sample.allreduce
            self._epoch_allreduce = (self._epoch_allreduce or 0.0) + sample.allreduce
            s.allreduce_share = self._epoch_allreduce / self._epoch_seconds if self._epoch_seconds > 0 else None

    def epoch(self, record: dict, history: list[dict]) -> None:
        s = self.state
        s.epoch = record["epoch"]
        s.train_accuracy, s.val_accuracy = record["train_accuracy"], record["val_accuracy"]
        s.val_loss = record["val_loss"]
        s.images_per_second = record["images_per_sec"]

    def balance(self, batches: list[int], speeds: list[float]) -> None:
        self.state.balance_batches, self.state.balance_speeds = list(batches), list(speeds)

    def finish(self) -> None:
        """Mark the run done; with output.metrics_linger_seconds, keep serving until one more
        scrape has seen the final values (or that long), so a short job is not missed."""
        self.state.done = True
        if self.linger_seconds > 0:
            self.collector.scraped_when_done.wait(self.linger_seconds)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
