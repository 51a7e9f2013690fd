"""The sweep as an MLflow parent run (`hvdcls sweep --mlflow URI`): its trials' `hvdcls train` runs
are its children (each job is given the parent's id: output.mlflow_parent_run, which MLflow's
tag `mlflow.parentRunId` records). The parent holds the space as params, each finished trial's
metric at step = its number, the best value, and the sweep's table, plot and best.yaml.

The parent's id is kept in the study (a user attribute), so a resumed sweep goes on in the same
run. As for a training run, a tracker that is down costs a warning, not the sweep: the trials
then train untracked.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from hvdcls.observe.tracking import MLFLOW_DEFAULTS, one_line
from hvdcls.sweep.space import Parameter

PARENT_ATTR = "mlflow_parent_run"


class ParentRun:
    def __init__(self, uri: str, experiment: str, study, name: str):
        self.uri = uri
        self.client: Any = None
        self.run_id: Optional[str] = None
        try:
            self._open(experiment, study, name)
        except ImportError:
            self._off("mlflow is not installed (pip install 'hvdcls[track]', or make setup)")
        except Exception as err:  # the tracker's trouble, whatever it is, is not the sweep's
            self._off(one_line(err))

    def _open(self, experiment: str, study, name: str) -> None:
        for key, value in MLFLOW_DEFAULTS.items():
            os.environ.setdefault(key, value)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        self.run_id = study.user_attrs.get(PARENT_ATTR)
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
            return
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=name, tags={"hvdcls.sweep": "true"}).info.run_id
        study.set_user_attr(PARENT_ATTR, self.run_id)

    def log_space(self, space: Sequence[Parameter], settings: dict[str, Any]) -> None:
        params = {f"space.{p.key}": describe(p) for p in space}
        self._call(lambda: [self.client.log_param(self.run_id, k, str(v)[:6000])
                            for k, v in {**params, **settings}.items()])

    def log_trial(self, number: int, metric: str, value: float) -> None:
        self._call(lambda: self.client.log_metric(self.run_id, f"trial_{metric}", value,
                                                  int(time.time() * 1000), number))

    def end(self, out_dir: Path, files: Sequence[str], best: Optional[float], metric: str, status: str) -> None:
        def finish() -> None:
            if best is not None:
                self.client.log_metric(self.run_id, f"best_{metric}", best)
            for name in files:
                if (Path(out_dir) / name).is_file():
                    self.client.log_artifact(self.run_id, str(Path(out_dir) / name))
            self.client.set_terminated(self.run_id, status)
        self._call(finish)

    def _call(self, action) -> None:
        if self.run_id is None or self.client is None:
            return
        try:
            action()
        except Exception as err:
            self._off(one_line(err))

    def _off(self, why: str) -> None:
        self.run_id = None
        print(f"hvdcls: warning: MLflow tracking to {self.uri} is off for this sweep: {why}",
              file=sys.stderr, flush=True)


def describe(param: Parameter) -> str:
    if param.kind in ("choice", "fixed"):
        return f"{param.kind}({', '.join(map(str, param.values))})"
    scale = "log " if param.log else ""
    step = f" step {param.step:g}" if param.step is not None else ""
    return f"{scale}{param.kind}({param.low:g}, {param.high:g}{step})"
