"""Fine-tuning on a backend in one process (hvd.init() with size 1): the class-weighted loss
against torch's semantics in numpy, the frozen phase (the head moves, nothing else does, under
each way of reducing the gradients) and its end, layer decay's rate per block, the range test
on the frozen model, and a resume from a checkpoint of the frozen epochs.

tests/torch_backend/test_finetune.py and tests/tf_backend/test_finetune.py run these cases, each
defining the module-scoped `framework` fixture: an object with
    name: the backend's name
    train_loss(backend, labels, logits) -> the loss the backend's train step computes (float)
    trainable(backend) -> the trained parameters' values, in the model's order (copies)
    untouched_state(backend, count) -> whether the optimizer holds nothing but zeros (or no state)
        for the first `count` trained parameters
"""
import shutil

import numpy as np
import pytest

from hvdcls import config, finetune
from hvdcls.data import datasets
from hvdcls.training import lr_sweep
from hvdcls.training.loop import loss_class_weights
from tests.cases.lr_find import built
from tests.cases.train import hvdcls_train, ok
from tests.run_files import read_json

BASE = ["training.threads=1", "training.batch_size=16", "training.seed=5"]
CLASSES = 10  # the digits'
HEAD = 2  # compact_cnn's head: its last two parameters (kernel and bias)
# A fifth of the digits' images, for the launches: what they check is exactness, not learning.
SMALL_DATA = ["data.name=synthetic", "data.synthetic.num_samples=320", "data.synthetic.num_classes=4"]


def reference_loss(labels: np.ndarray, logits: np.ndarray, weights: np.ndarray, smoothing: float) -> float:
    """torch.nn.CrossEntropyLoss(weight=weights, label_smoothing=smoothing) on class indices."""
    shifted = logits - logits.max(1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    w_y = weights[labels]
    nll = -log_p[np.arange(len(labels)), labels]
    smooth = -(log_p * weights).sum(1)
    return float(((1 - smoothing) * (w_y * nll).sum() + smoothing / len(weights) * smooth.sum()) / w_y.sum())


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_class_weighted_loss_is_torchs(framework, smoothing):
    cfg = config.load(overrides=[*BASE, f"training.label_smoothing={smoothing}"])
    backend = built(framework.name, cfg, CLASSES)
    rng = np.random.default_rng(2)
    logits = rng.normal(scale=3.0, size=(12, CLASSES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, 12)
    weights = finetune.class_weights(rng.integers(0, CLASSES, 200), CLASSES)
    backend.set_class_weights(weights)
    loss = framework.train_loss(backend, labels, logits)
    assert loss == pytest.approx(reference_loss(labels, logits, np.array(weights), smoothing), rel=1e-6)
    unweighted = reference_loss(labels, logits, np.ones(CLASSES), smoothing)
    assert abs(loss - unweighted) > 1e-3  # the weights matter here
    backend.set_class_weights(None)
    assert framework.train_loss(backend, labels, logits) == pytest.approx(unweighted, rel=1e-6)


def steps(backend, cfg, data, count: int, lr: float = 0.05):
    for _, batch in zip(range(count), lr_sweep.batches(cfg, backend, backend.context(), data)):
        backend.train_step(batch, lr)


def unchanged(before: list, after: list) -> list[bool]:
    return [bool(np.array_equal(a, b)) for a, b in zip(before, after)]


@pytest.mark.parametrize("options", [
    ["optimizer.name=sgd", "optimizer.weight_decay=0.01", "optimizer.layer_decay=0.5"],
    ["optimizer.name=adamw", "optimizer.weight_decay=0.05", "horovod.compression=powersgd",
     "horovod.powersgd.start_iter=2", "horovod.powersgd.min_compression_rate=1", "training.class_weights=auto"],
    ["optimizer.name=lamb", "horovod.backward_passes_per_step=2", "optimizer.layer_decay=0.7"],
], ids=["sgd-decay-layers", "adamw-powersgd-weights", "lamb-accumulate"])
def test_frozen_the_head_alone_trains_then_everything(framework, options):
    """Frozen from build (training.freeze_epochs=1): steps move the head and leave every other
    parameter bit for bit (weight decay, momentum and PowerSGD included); unfrozen, all move."""
    cfg = config.load(overrides=[*BASE, "training.freeze_epochs=1", *options])
    data = datasets.open_data(cfg)
    backend = built(framework.name, cfg, data.num_classes)
    backend.set_class_weights(loss_class_weights(cfg, data))  # as the loop does (None: unweighted)
    start = framework.trainable(backend)
    steps(backend, cfg, data, 4)  # PowerSGD: past its start_iter, compressing
    frozen = framework.trainable(backend)
    assert unchanged(start, frozen) == [True] * (len(start) - HEAD) + [False] * HEAD
    assert framework.untouched_state(backend, len(start) - HEAD)  # no momentum, no moments
    backend.set_frozen(False)
    steps(backend, cfg, data, 3)
    assert not any(unchanged(frozen, framework.trainable(backend)))
    assert not framework.untouched_state(backend, len(start) - HEAD)


def test_layer_decay_scales_each_blocks_step(framework):
    """One plain SGD step from the same weights on the same batch, with and without decay 0.5:
    each parameter's step is its block's multiple of the undecayed one (compact_cnn: 4 conv
    blocks at 1/16, 1/8, 1/4, 1/2, the head at 1)."""
    common = [*BASE, "optimizer.momentum=0", "optimizer.weight_decay=0"]
    plain_cfg = config.load(overrides=common)
    data = datasets.open_data(plain_cfg)
    plain = built(framework.name, plain_cfg, data.num_classes)
    decay_cfg = config.load(overrides=[*common, "optimizer.layer_decay=0.5"])
    decayed = built(framework.name, decay_cfg, data.num_classes)
    start = framework.trainable(plain)
    assert all(map(np.array_equal, start, framework.trainable(decayed)))
    steps(plain, plain_cfg, data, 1, lr=0.5)
    steps(decayed, decay_cfg, data, 1, lr=0.5)
    scales = [1 / 16] * 3 + [1 / 8] * 3 + [1 / 4] * 3 + [1 / 2] * 3 + [1.0] * 2
    for i, (s0, p, d, scale) in enumerate(zip(start, framework.trainable(plain), framework.trainable(decayed),
                                              scales)):
        assert np.abs(p - s0).max() > 1e-4, i  # it moved: the ratio says something
        np.testing.assert_allclose(d - s0, scale * (p - s0), rtol=1e-3, atol=1e-6, err_msg=str(i))


def test_the_range_test_sweeps_the_frozen_phase_and_restores_it(framework):
    cfg = config.load(overrides=[*BASE, "training.freeze_epochs=2", "optimizer.lr=auto",
                                 "optimizer.lr_find.steps=8", "optimizer.layer_decay=0.65"])
    data = datasets.open_data(cfg)
    backend = built(framework.name, cfg, data.num_classes)
    start = framework.trainable(backend)
    resolved, account = lr_sweep.resolve(cfg, backend, backend.context(), data)
    assert account["steps"] >= 2 and resolved.optimizer.lr > 0
    assert all(unchanged(start, framework.trainable(backend)))  # restored
    steps(backend, resolved, data, 2)  # still frozen: the head alone moves
    assert unchanged(start, framework.trainable(backend))[:-HEAD] == [True] * (len(start) - HEAD)


def test_a_checkpoint_of_the_frozen_epochs_resumes_frozen(framework, tmp_path):
    """3 epochs, the first 2 frozen, a checkpoint after each; resumed from the first, epoch 2
    is frozen again and epoch 3 not: the same final weights as the uninterrupted run."""
    run, again = tmp_path / "run", tmp_path / "again"
    settings = [*SMALL_DATA, "training.freeze_epochs=2", "optimizer.layer_decay=0.65", "training.class_weights=auto",
                "output.checkpoint_every=1", "output.keep_checkpoints=3"]
    ok(hvdcls_train(tmp_path, framework.name, "--epochs", 3, "--output-dir", run, *settings))
    shutil.copytree(run, again)
    resumed = ok(hvdcls_train(tmp_path, framework.name, "--epochs", 3, "--resume",
                              again / "checkpoints" / "epoch-0001", *settings))
    assert "after epoch 1" in resumed.stdout and "epoch 2:" in resumed.stdout  # it trained 2 and 3 again
    digests = [read_json(path / "summary.json")["rank_weight_digests"] for path in (run, again)]
    assert digests[0] == digests[1]
