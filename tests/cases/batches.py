"""What a backend receives from the core's augmentation and batch mixing: exactly the core's
numpy batches (so both backends see identical pixels for every augmentation, whatever the number
of loader workers), and a soft-target loss that matches the numpy reference.

tests/torch_backend/test_batches.py and tests/tf_backend/test_batches.py run these cases, each
defining the module-scoped `framework` fixture: an object with
    loader(batches, workers) -> iterable of (images NHWC, labels) as numpy arrays
    loss_and_correct(targets, logits, smoothing) -> (mean loss, correct) through the backend's code
    name, cpu (the backend's device value), batch(images NHWC, labels) -> a framework batch,
    ema_names(backend) -> the names of the weights the EMA averages
    raw_loader(batches, workers) -> the backend's loader itself (framework tensors)
    backend_loader(batches, workers) -> (images NHWC float32 as training gets them, the dtype
        the loader handed over) from the backend class's loader
    loader_worker(loader, batches) -> what the backend's loader_worker says
    worker_named -> a pattern of what it says while a loader worker holds a batch
"""
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hvdcls.config import AugmentConfig, DataConfig
from hvdcls.data.batches import EpochBatches, LoaderWait
from hvdcls.data.mixing import BatchMix
from hvdcls.data.sources import ArraySource
from hvdcls.data.transforms import Preprocess

CLASSES = 4
# Every augmentation the core has, each in one configuration (with a preset, erasing and mixing).
AUGMENTATIONS = {
    "randaugment+mixup": (dict(preset="imagenet", policy="randaugment", random_erase=0.5), dict(mixup_alpha=0.4)),
    "trivialaugment+cutmix": (dict(preset="small", policy="trivialaugment", hflip=0.5), dict(cutmix_alpha=1.0)),
    "autoaugment+both": (dict(preset="imagenet", policy="autoaugment", random_erase=1.0),
                         dict(mixup_alpha=0.2, cutmix_alpha=1.0)),
    "none": (dict(preset="none"), {}),
}


def epoch_batches(augment: dict, mixing: dict) -> EpochBatches:
    images = np.random.default_rng(0).integers(0, 256, (24, 20, 20, 3), dtype=np.uint8)
    source = ArraySource(images, np.arange(24) % CLASSES)
    config = DataConfig(image_size=16, augment=AugmentConfig(**augment), **mixing)
    return EpochBatches(source, [np.arange(k, k + 6) for k in range(0, 24, 6)], Preprocess(config, 5),
                        epoch=1, train=True, mix=BatchMix(config, CLASSES, 5))


@pytest.mark.parametrize("name", AUGMENTATIONS)
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_yields_the_cores_pixels(framework, name, workers):
    batches = epoch_batches(*AUGMENTATIONS[name])
    received = list(framework.loader(batches, workers))
    assert len(received) == len(batches)
    for k, (images, labels) in enumerate(received):
        expected_images, expected_labels = batches[k]
        assert images.dtype == np.float32 and np.array_equal(images, expected_images), (name, k)
        assert labels.dtype == expected_labels.dtype and np.array_equal(labels, expected_labels)
    if AUGMENTATIONS[name][1]:
        assert received[0][1].shape == (6, CLASSES)  # soft targets


def reference_loss(targets: np.ndarray, logits: np.ndarray, smoothing: float) -> float:
    shifted = logits - logits.max(1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    smoothed = (1 - smoothing) * targets + smoothing / targets.shape[1]
    return float(-(smoothed * log_softmax).sum(1).mean())


# Without erasing or mixing (they need the floats in the worker), the workers hand over uint8.
UINT8_AUGMENTATIONS = {"randaugment": dict(preset="imagenet", policy="randaugment"),
                       "small+flip": dict(preset="small", hflip=0.5)}


@pytest.mark.parametrize("train", [True, False])
def test_uint8_hand_over_normalises_to_the_cores_floats(framework, train):
    """The backend's own loader hands over uint8 and normalises after it (torch: on the device,
    in to_device); the floats are the core's within 1e-6; erasing or mixing keeps floats."""
    for name, augment in UINT8_AUGMENTATIONS.items():
        batches = epoch_batches(augment, {})
        batches.train = train
        received = list(framework.backend_loader(batches, 1))
        assert len(received) == len(batches)
        for k, (images, handed_over) in enumerate(received):
            assert handed_over == "uint8" and images.dtype == np.float32, name
            assert np.abs(images - batches[k][0]).max() <= 1e-6, (name, k)
    erasing = epoch_batches(*AUGMENTATIONS["randaugment+mixup"])
    assert [handed for _, handed in framework.backend_loader(erasing, 1)] == ["float32"] * len(erasing)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_soft_target_loss_and_dominant_label_accuracy(framework, smoothing):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(8, CLASSES)).astype(np.float32)
    targets = np.zeros((8, CLASSES), np.float32)
    dominant = rng.integers(0, CLASSES, 8)
    targets[np.arange(8), dominant] = 0.7
    targets[np.arange(8), (dominant + 1) % CLASSES] += 0.3
    loss, correct = framework.loss_and_correct(targets, logits, smoothing)
    assert loss == pytest.approx(reference_loss(targets, logits, smoothing), rel=1e-5)
    assert correct == int((logits.argmax(1) == dominant).sum())
    hard = np.eye(CLASSES, dtype=np.float32)[dominant]  # a one-hot target: the plain loss
    hard_loss, _ = framework.loss_and_correct(hard, logits, smoothing)
    assert hard_loss == pytest.approx(reference_loss(hard, logits, smoothing), rel=1e-5)


def test_ema_update_follows_the_numpy_reference(framework, tmp_path):
    """The backend's model EMA, built in this process (one rank): starts as the weights, updates
    as hvdcls.training.ema.update does, swaps in and out without touching the weights, and
    comes back from a checkpoint."""
    from hvdcls import config, registry
    from hvdcls.training import ema

    cfg = config.load(overrides=["training.ema_decay=0.9", "training.threads=1"])
    backend = registry.create_backend(framework.name)
    backend.hvd.init()  # not backend.init(): other tests in this process set the threads already
    backend.threads, backend.device = 1, framework.cpu
    backend.build(cfg, CLASSES)

    def weights():  # copies: a read of backend.weights() is live
        return backend.weights().copied()

    start = weights()
    with backend.ema_weights():
        assert all(np.array_equal(a, start[k]) for k, a in backend.weights().items())
    rng = np.random.default_rng(0)
    images = rng.normal(size=(8, 16, 16, 3)).astype(np.float32)
    backend.train_step([framework.batch(images, rng.integers(0, CLASSES, 8))], 0.05)
    trained = weights()
    backend.ema_update(0.9)
    with backend.ema_weights():
        averaged = weights()
    assert all(np.array_equal(a, trained[k]) for k, a in backend.weights().items())  # put back
    expected = ema.update(start, trained, 0.9)
    moved = 0
    for name in framework.ema_names(backend):
        assert np.allclose(averaged[name], expected[name], rtol=1e-5, atol=1e-6), name
        moved += not np.array_equal(averaged[name], trained[name])
    assert moved  # an average, not a copy
    backend.save(tmp_path)
    backend.ema_update(0.0)  # the warmup's update: a copy
    with backend.ema_weights():
        assert all(np.array_equal(a, trained[k]) for k, a in backend.weights().items())
    backend.load(tmp_path)  # the checkpoint's EMA, not the copy
    with backend.ema_weights():
        assert all(np.array_equal(a, averaged[k]) for k, a in weights().items())


@dataclass
class HeldBatches(EpochBatches):
    """Batch 1 is read only once the file `release` exists (a loader worker held in its read)."""

    release: Path = Path("/nonexistent")

    def _read(self, k: int, uint8: bool = False):
        deadline = time.monotonic() + 60
        while k == 1 and not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return super()._read(k, uint8)


def held_batches(release: Path) -> HeldBatches:
    plain = epoch_batches(*AUGMENTATIONS["none"])
    return HeldBatches(plain.source, plain.batches, plain.preprocess, plain.epoch, plain.train,
                       plain.mix, release=release)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_names_the_worker_holding_the_batch_waited_for(framework, workers, tmp_path):
    """What the watchdog adds to "stuck reading data": batch 1 held in its read, the loop
    waiting for it after batch 0 (hvdcls.backend.Backend.loader_worker)."""
    release = tmp_path / "release"
    batches = held_batches(release)
    loader = LoaderWait(framework.raw_loader(batches, workers))
    stream = iter(loader)
    if workers == 0:  # read in this thread, at next(): no worker to name
        next(stream)
        assert framework.loader_worker(loader, batches) is None
    else:
        next(stream)
        said, deadline = None, time.monotonic() + 30
        while said is None and time.monotonic() < deadline:  # until a worker has batch 1
            said = framework.loader_worker(loader, batches)
            time.sleep(0.05)
        assert said is not None and re.fullmatch(framework.worker_named, said), said
        assert str(threading.get_native_id()) not in said  # a worker, not this thread
    release.touch()
    assert len(list(stream)) == len(batches) - 1


def test_the_step_marks_where_it_starts_waiting_for_the_all_reduce(framework, passes=1):
    """The watchdog's phases (hvdcls.training.watchdog): once per step, when backward is done
    (torch before synchronize(), TensorFlow a mark inside its compiled step); the mark changes
    no number: the same step unmarked gives the same weights."""
    from hvdcls import config, registry

    cfg = config.load(overrides=["training.threads=1", "training.seed=3"])
    rng = np.random.default_rng(0)
    batch = [framework.batch(rng.normal(size=(8, 16, 16, 3)).astype(np.float32),
                             rng.integers(0, CLASSES, 8)) for _ in range(passes)]
    trained = []
    for marking in (True, False):
        backend = registry.create_backend(framework.name)
        backend.hvd.init()
        backend.threads, backend.device = 1, framework.cpu
        backend.seed(3)
        backend.build(cfg, CLASSES)
        marks = []
        backend.marks_allreduce_wait = marking
        backend.allreduce_wait_hook = lambda: marks.append(threading.get_native_id())
        for _ in range(3):
            backend.train_step(batch, 0.05)
        assert len(marks) == (3 if marking else 0), (marking, marks)
        trained.append(backend.weights().copied())
    marked, unmarked = (list(weights.values()) for weights in trained)  # Keras renames a 2nd model
    assert len(marked) == len(unmarked) and all(map(np.array_equal, marked, unmarked))
