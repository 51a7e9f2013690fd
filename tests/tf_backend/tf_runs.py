"""Runs for the tensorflow tests of models in and out: one real `hvdcls train --backend
tensorflow` (one epoch on tiny synthetic data, compact_cnn with an EMA, started from a
.weights.h5 file of another class count), trained once per test session and shared by
test_weights.py and test_inference.py; and a run directory written by hand for another backend.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import keras

from hvdcls import config as cfg
from hvdcls import modelcard
from tf_backend import models

CLASSES = 3
FILE_CLASSES = 10  # the starting file's head
IMAGE_SIZE = 16
TINY_SYNTHETIC = ("data.name=synthetic", "data.synthetic.num_samples=64", f"data.image_size={IMAGE_SIZE}",
                  f"data.synthetic.num_classes={CLASSES}", "data.workers=0", "training.batch_size=16",
                  "schedule.warmup_epochs=0", "output.report=false", "output.tensorboard=false")
_trained: dict[str, "TrainedRun"] = {}


class TrainedRun:
    """The shared run: its directory, its stdout, and the file it started from."""

    def __init__(self, run_dir: Path, stdout: str, start_file: Path, start_model: keras.Model):
        self.run_dir, self.stdout, self.start_file, self.start_model = run_dir, stdout, start_file, start_model


def trained_run(tmp_path_factory) -> TrainedRun:
    """The session's one real run (made on first use): EMA decay 0.5, from compact_cnn weights
    at FILE_CLASSES classes, so the build hook replaces the head."""
    if "run" not in _trained:
        work = tmp_path_factory.mktemp("tf-run")
        keras.utils.set_random_seed(7)
        start = models.compact_cnn(FILE_CLASSES, IMAGE_SIZE)
        start_file = work / "cnn10.weights.h5"
        start.save_weights(start_file)
        result = hvdcls_train(work, "--output-dir", str(work / "run"), "model.name=compact_cnn",
                              "training.ema_decay=0.5", f"model.weights={start_file}")
        _trained["run"] = TrainedRun(work / "run", result.stdout, start_file, start)
    return _trained["run"]


def hvdcls_train(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    """One plain process of `hvdcls train --backend tensorflow` for one epoch on TINY_SYNTHETIC
    (then `overrides`), in `cwd`; fails the test unless it succeeds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-m", "hvdcls", "train", "--backend", "tensorflow", "--epochs", "1",
                             *TINY_SYNTHETIC, *overrides], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def write_foreign_run(run_dir: Path, backend: str) -> Path:
    """A run directory in the layout `hvdcls train` leaves (config.yaml, model_card.json,
    checkpoints/epoch-0001/state.json), of `backend`, with no weights in it."""
    config = cfg.load(overrides=["model.name=compact_cnn", *TINY_SYNTHETIC[:3]])
    checkpoint = run_dir / "checkpoints" / "epoch-0001"
    checkpoint.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml(config))
    modelcard.write(run_dir, modelcard.from_config(config, backend, [f"c{i}" for i in range(CLASSES)]))
    (checkpoint / "state.json").write_text(json.dumps({"backend": backend, "epoch": 1}))
    return run_dir
