"""A torchvision-style recipe under horovodrun, 2 ranks, each backend, in one short launch:
RandAugment, random erasing, mixup and cutmix, label smoothing and a model EMA on the digits.

Must hold: the run trains; the metrics are reduced exactly over the ranks (every image counted
once, whole numbers of correct dominant labels); the weights and the EMA copy are identical on
every rank; the EMA is evaluated beside the weights and kept in the checkpoint.
"""
import numpy as np
import pytest

from tests.parallel.test_train import NP, train
from tests.run_files import read_json, read_metrics

pytestmark = pytest.mark.parallel
EPOCHS = 3
RECIPE = ["--epochs", str(EPOCHS), "data.augment.policy=randaugment", "data.augment.random_erase=0.25",
          "data.mixup_alpha=0.2", "data.cutmix_alpha=1.0", "training.label_smoothing=0.1",
          "training.ema_decay=0.99", "training.ema_steps=2", "output.checkpoint_every=0",
          "output.report=false", "output.tensorboard=false"]


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def recipe_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"recipe-{request.param}") / "run"
    train("horovodrun", NP, request.param, out, *RECIPE)
    return request.param, out


def test_recipe_trains_with_exact_metrics_and_identical_ema_on_every_rank(recipe_run):
    backend, out = recipe_run
    summary, metrics = read_json(out / "summary.json"), read_metrics(out)
    assert len(set(summary["rank_weight_digests"])) == 1 and len(summary["rank_weight_digests"]) == NP
    assert len(set(summary["rank_ema_digests"])) == 1 and len(summary["rank_ema_digests"]) == NP
    assert summary["rank_ema_digests"] != summary["rank_weight_digests"]  # an average, not a copy
    per_step = 32 * NP  # digits.yaml's batch on each rank
    for record in metrics:
        assert record["train_images"] == record["steps"] * per_step
        assert record["val_images"] == summary["data"]["val"]  # every validation image, once
        for key, images in (("train_accuracy", "train_images"), ("val_accuracy", "val_images"),
                            ("ema_val_accuracy", "val_images")):
            correct = record[key] * record[images]
            assert correct == pytest.approx(round(correct), abs=1e-6), (key, correct)
    last = metrics[-1]
    assert last["val_accuracy"] > 0.5 and last["ema_val_accuracy"] > 0.5, last  # chance: 0.1
    assert last["ema_val_loss"] != last["val_loss"]
    assert summary["ema_val_accuracy"] == last["ema_val_accuracy"]
    assert summary["augment"]["preset"] == "imagenet"  # digits' own, from the config
    checkpoint = out / "checkpoints" / f"epoch-{EPOCHS:04d}"
    if backend == "torch":
        import torch
        state = torch.load(checkpoint / "torch.pt", weights_only=True)
        assert set(state["ema"]) <= set(state["model"]) and state["ema"]
    else:
        with np.load(checkpoint / "tensorflow.npz") as arrays:
            assert any(name.startswith("ema/") for name in arrays.files)
