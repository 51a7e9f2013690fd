"""Fine-tuning under horovodrun, 2 ranks, one launch per backend: pretrained weights from a file,
the first epoch frozen, layer decay and class weights all in force. Every rank ends with the
same weights; the frozen epoch moved the head and no other parameter (checkpoint 1 holds the
file's backbone bit for bit); the next epoch moved everything."""
import json
import subprocess
import sys

import pytest

from hvdcls.launching import launch
from tests.cases.finetune import SMALL_DATA
from tests.parallel.test_train import NO_PICTURES, NP, REPO, train
from tests.run_files import read_json, read_metrics

pytestmark = pytest.mark.parallel
CLASSES = 4  # SMALL_DATA's
WEIGHTS_FILE = {"torch": "start.pth", "tensorflow": "start.weights.h5"}


def weights_helper(*args) -> str:
    """tests/parallel/finetune_weights.py in its own process (this one imports no framework)."""
    result = subprocess.run([sys.executable, "-m", "tests.parallel.finetune_weights", *map(str, args)],
                            cwd=REPO, env=launch.single_host_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_frozen_then_unfrozen_with_layer_decay_and_class_weights_on_two_ranks(backend, tmp_path):
    start = tmp_path / WEIGHTS_FILE[backend]
    weights_helper("write", backend, CLASSES, start)
    out = tmp_path / "run"
    train("horovodrun", NP, backend, out, "--epochs", "2", *SMALL_DATA, *NO_PICTURES, f"model.weights={start}",
          "training.freeze_epochs=1", "optimizer.layer_decay=0.65", "training.class_weights=auto",
          "output.checkpoint_every=1")
    summary = read_json(out / "summary.json")
    digests = summary["rank_weight_digests"]
    assert len(digests) == NP and len(set(digests)) == 1, digests
    config = summary["config"]
    assert (config["training"]["freeze_epochs"], config["optimizer"]["layer_decay"],
            config["training"]["class_weights"]) == (1, 0.65, "auto")
    assert [r["epoch"] for r in read_metrics(out)] == [1, 2]
    checkpoints = [out / "checkpoints" / f"epoch-000{epoch}" for epoch in (1, 2)]
    equal = json.loads(weights_helper("compare", backend, CLASSES, start, *checkpoints))
    heads = equal["head"]
    assert sum(heads) == 2 and len(heads) == 14  # compact_cnn: the dense layer's kernel and bias
    frozen_epoch, unfrozen_epoch = equal[str(checkpoints[0])], equal[str(checkpoints[1])]
    assert frozen_epoch == [not head for head in heads]  # the head moved, nothing else did
    assert not any(unfrozen_epoch)  # then everything trained
