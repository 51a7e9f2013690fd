"""Runs for the torch tests of models in and out: a run directory written by hand in the
layout `hvdcls train` leaves (config.yaml, model_card.json, checkpoints/epoch-N/state.json and
torch.pt), and a real one-epoch `hvdcls train` on synthetic data."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from hvdcls import config as cfg
from hvdcls import modelcard
from torch_backend.weights import CHECKPOINT_FILE

TINY_SYNTHETIC = ("data.name=synthetic", "data.synthetic.num_samples=64", "data.image_size=16",
                  "data.workers=0", "training.batch_size=16", "schedule.warmup_epochs=0",
                  "output.report=false", "output.tensorboard=false")


def write_run(run_dir: Path, backend: str, state: dict, model: str = "compact_cnn", classes: int = 3,
              ema: bool = False) -> Path:
    """`state` as torch.pt of checkpoint epoch-0002 of a run of `model` on `classes` classes
    (c0, c1, ...) at 16 px; its card names the EMA's weights when `ema`."""
    config = cfg.load(overrides=[f"model.name={model}", "data.name=synthetic", "data.image_size=16"])
    checkpoint = run_dir / "checkpoints" / "epoch-0002"
    checkpoint.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml(config))
    card = modelcard.from_config(config, backend, [f"c{i}" for i in range(classes)])
    card.weights = "ema" if ema else "model"
    modelcard.write(run_dir, card)
    (checkpoint / "state.json").write_text(json.dumps({"backend": backend, "epoch": 2}))
    torch.save(state, checkpoint / CHECKPOINT_FILE)
    return run_dir


def hvdcls_train(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    """One plain process of `hvdcls train --backend torch` for one epoch on TINY_SYNTHETIC
    (then `overrides`), in `cwd`; fails the test unless it succeeds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "hvdcls", "train", "--backend", "torch", "--epochs", "1",
                             *TINY_SYNTHETIC, *overrides], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
