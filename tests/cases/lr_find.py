"""optimizer.lr=auto in one process (hvd.init() with size 1): the range test on the backend's
real steps, and the state it leaves. Restoring must be exact: a model that ran the sweep and
one that did not, trained on from there, stay identical bit for bit, which needs every weight,
buffer and optimizer slot (momentum, Adam's moments and step count, PowerSGD's Q, errors and
step) put back.

tests/torch_backend/test_lr_find.py and tests/tf_backend/test_lr_find.py run these cases, each
defining the module-scoped `backend` fixture (the backend's name).
"""
import math

import numpy as np
import pytest

from hvdcls import config, registry
from hvdcls.data import datasets
from hvdcls.training import lr_sweep

SWEEP = ["optimizer.lr=auto", "optimizer.lr_find.steps=14", "training.threads=1", "training.seed=3",
         "training.batch_size=16"]


def built(name: str, cfg: config.Config, classes: int):
    backend = registry.create_backend(name)
    backend.hvd.init()  # not backend.init(): other tests in this process set the threads already
    backend.threads = 1
    backend.device = backend.setup(cfg, 0, 1) if name == "torch" else "cpu"
    backend.seed(cfg.training.seed)
    backend.build(cfg, classes)
    return backend


def values(backend) -> list[np.ndarray]:
    """Copies, in the model's order (Keras renames a second model's variables)."""
    return [np.array(v) for v in backend.weights().values()]


@pytest.mark.parametrize("options", [["optimizer.name=sgd"],
                                     ["optimizer.name=adamw", "horovod.compression=powersgd",
                                      "horovod.powersgd.start_iter=4"]],
                         ids=["sgd-momentum", "adamw-powersgd"])
def test_the_sweep_leaves_the_run_exactly_where_it_was(backend, options):
    cfg = config.load(overrides=[*SWEEP, *options])  # the digits, 16 px
    data = datasets.open_data(cfg)
    swept, untouched = built(backend, cfg, data.num_classes), built(backend, cfg, data.num_classes)
    start = values(swept)
    assert all(map(np.array_equal, start, values(untouched)))  # the same seed, the same model
    resolved, account = lr_sweep.resolve(cfg, swept, swept.context(), data)
    assert 2 <= account["steps"] <= 14 and all(math.isfinite(p[1]) for p in account["curve"][:-1])
    assert isinstance(resolved.optimizer.lr, float) and resolved.optimizer.lr > 0
    assert account["rank_choices"] == [[account["lr"], account["steps"]]]
    assert all(map(np.array_equal, start, values(swept)))  # every weight and buffer put back
    assert swept.communication()["steps"] == untouched.communication()["steps"]
    # and the optimizer: the same steps from here give the same weights, bit for bit
    batch = next(lr_sweep.batches(cfg, swept, swept.context(), data))
    for _ in range(6):  # past PowerSGD's start_iter: its Q and error feedback are in play
        swept.train_step(batch, 0.01)
        untouched.train_step(batch, 0.01)
    assert all(map(np.array_equal, values(swept), values(untouched)))
    assert not all(map(np.array_equal, start, values(swept)))  # they did train


def test_lr_find_prints_the_curve_and_writes_its_plot(backend, tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-m", "hvdcls", "lr-find", "--backend", backend,
                             "--output-dir", str(tmp_path / "find"), "optimizer.lr_find.steps=30",
                             "training.threads=1"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["lr", "smoothed", "loss"])
    assert lines[header - 1].startswith("hvdcls lr-find: 1 process(es), global batch 32")
    assert lines[header + 2].split()[0] == "1e-05"  # the first rate swept, under the rule
    chosen = next(line for line in lines if line.startswith("chosen: "))
    account = json.loads((tmp_path / "find" / "lr_find.json").read_text())
    assert f"{account['lr']:.4g} a step" in chosen and len(account["curve"]) == account["steps"] <= 30
    assert (tmp_path / "find" / "lr_find.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in (tmp_path / "find").iterdir() if p.name.startswith(".")]  # no temporaries left
