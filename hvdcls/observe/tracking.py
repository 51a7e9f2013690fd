"""MLflow tracking (`--mlflow URI`, `output.mlflow_uri`): one MLflow run per training run, rank 0 only.

    hvdcls train --mlflow http://mlflow.example:5000 output.mlflow_experiment=digits

At the start: the flattened config as params, tags (backend, world size, model, data set, the
Horovod settings in force, hvdcls's version, the source's git commit when there is one); after
every epoch its numbers from metrics.jsonl, at step = the epoch (1-based); at the end
summary.json, report.png and config.yaml as artifacts, and the run's status (FINISHED, FAILED).

Tracking is a guest of the run: mlflow missing, a server that is down or an error answered
cost one warning line, and tracking stops for the rest of the run; training goes on. The
exchanges run on a thread of their own, so training never waits on them; the run's end waits
for the last ones at most END_WAIT_SECONDS. MLflow's HTTP client retries for minutes by
default, so unless the environment says otherwise we allow it one retry and 5 s a request
(MLFLOW_DEFAULTS): a server that is down is found out in seconds. mlflow is imported here, on
that thread, and only when tracking is on.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from hvdcls import __version__
from hvdcls.launching import horovod_env
from hvdcls.observe.monitor import RunInfo, Sink

# MLflow's own variables, set only where the environment leaves them unset. Its client would
# also print the run's URL on stdout from our thread, in the middle of the progress lines.
MLFLOW_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                   "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
                   "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
ARTIFACTS = ("summary.json", "report.png", "config.yaml")  # those the run wrote, at its end
PARAM_VALUE_LIMIT = 6000  # MLflow refuses longer param values (a long list, say)
SOURCE = Path(__file__).resolve().parent  # a checkout's commit is the code's version
END_WAIT_SECONDS = 30.0  # at the run's end, for what is still to send (the artifacts)


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """{'optimizer': {'lr': 0.4}} -> {'optimizer.lr': '0.4'}: the config as MLflow's params."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:PARAM_VALUE_LIMIT]
    return flat


def epoch_metrics(record: dict) -> dict[str, float]:
    """The numbers of one metrics.jsonl line (not the epoch itself: it is the step)."""
    return {key: float(value) for key, value in record.items()
            if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def git_commit(source: Path = SOURCE) -> Optional[str]:
    """The commit of the checkout hvdcls runs from; None for an installed copy (or no git)."""
    try:
        result = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def run_tags(info: RunInfo, run_dir: Path) -> dict[str, str]:
    tags = {"backend": info.backend, "world_size": str(info.world_size), "model": info.model,
            "dataset": info.dataset, "hvdcls_version": __version__, "run_dir": str(run_dir.resolve()),
            **{f"horovod.{name}": value for name, value in horovod_env.in_force(os.environ).items()}}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit  # the tag MLflow's UI shows as the run's commit
    return tags


class MlflowSink(Sink):
    """The run's watcher that reports to an MLflow tracking server (or any MLflow tracking URI).

    Every exchange runs in order on one background thread, so neither mlflow's import (seconds)
    nor a slow tracker holds up the training step that rank 0's peers wait on; close() gives
    the last ones (the artifacts) END_WAIT_SECONDS to go out."""

    def __init__(self, uri: str, experiment: str, config: dict, run_dir: Path):
        self.uri, self.experiment, self.config, self.run_dir = uri, experiment, config, Path(run_dir)
        self.client: Any = None
        self.run_id: Optional[str] = None
        self.off = False  # set by the first failure: one warning, then silence
        self.ended = False  # finished, failed or killed: nothing more to send
        self.work: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name="hvdcls-mlflow", daemon=True)
        self.thread.start()
        self.work.put(self._import)  # mlflow's import starts now, while the run sets up

    def start(self, info: RunInfo) -> None:
        self.work.put(lambda: self._open(info))

    def epoch(self, record: dict, history: list[dict]) -> None:
        self.work.put(lambda: self._log_epoch(dict(record)))

    def finish(self) -> None:
        self.work.put(lambda: self._end("FINISHED"))

    def failed(self, error: str) -> None:
        self.work.put(lambda: self._end("FAILED", error))

    def close(self, wait: float = END_WAIT_SECONDS) -> None:
        """Neither finished nor failed (interrupted): MLflow's word for it is KILLED."""
        self.work.put(lambda: self._end("KILLED"))
        self.work.put(None)
        self.thread.join(wait)
        if self.thread.is_alive() and not self.off:
            self._stop(f"still busy after {wait:.0f} s at the run's end; what is left is not sent")

    def _serve(self) -> None:
        for action in iter(self.work.get, None):
            if self.off or self.ended:
                continue
            try:
                action()
            except ImportError:
                self._stop("mlflow is not installed (pip install 'hvdcls[track]', or make setup)")
            except Exception as err:  # the tracker's trouble, whatever it is, is not the run's
                self._stop(one_line(err))

    def _import(self) -> None:
        for name, value in MLFLOW_DEFAULTS.items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)

    def _open(self, info: RunInfo) -> None:
        if self.run_id is not None:  # an elastic reset restarts the watchers: the same run goes on
            self.client.set_tag(self.run_id, "world_size", str(info.world_size))
            return
        from mlflow.entities import Param, RunTag

        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_dir.name).info.run_id
        tags = run_tags(info, self.run_dir)
        parent = self.config.get("output", {}).get("mlflow_parent_run")
        if parent:  # a sweep's trial: MLflow shows it under the sweep's run
            tags["mlflow.parentRunId"] = parent
        self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in flatten(self.config).items()],
                              tags=[RunTag(k, v) for k, v in tags.items()])

    def _log_epoch(self, record: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, record["epoch"]) for key, value in epoch_metrics(record).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def _end(self, status: str, error: Optional[str] = None) -> None:
        self.ended = True
        if self.run_id is None:  # it ended before training began: there is no run
            return
        if status == "FINISHED":
            for name in ARTIFACTS:
                if (self.run_dir / name).is_file():
                    self.client.log_artifact(self.run_id, str(self.run_dir / name))
        if error:
            self.client.set_tag(self.run_id, "error", error)
        self.client.set_terminated(self.run_id, status)

    def _stop(self, why: str) -> None:
        self.off = True
        print(f"hvdcls: warning: MLflow tracking to {self.uri} is off for the rest of this run: {why}",
              file=sys.stderr, flush=True)


def one_line(err: Exception, limit: int = 300) -> str:
    """An exception as a short line: MLflow's own can run to a whole retry history."""
    text = str(err).splitlines()[0] if str(err) else ""
    line = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."
