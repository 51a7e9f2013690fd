"""hvdcls.data.mixing: mixup and cutmix label arithmetic, seeded draws, and EpochBatches' soft targets."""
import numpy as np
import pytest

from hvdcls.config import DataConfig
from hvdcls.data import mixing
from hvdcls.data.batches import EpochBatches
from hvdcls.data.sources import ArraySource
from hvdcls.data.transforms import Preprocess

LABELS = np.array([0, 1, 2, 1], np.int64)


def batch(n=4, size=8) -> np.ndarray:
    return np.stack([np.full((size, size, 3), i + 1, np.float32) for i in range(n)])


def test_mixup_mixes_each_sample_with_the_previous_one():
    images, targets = mixing.mixup(batch(), mixing.one_hot(LABELS, 3), 0.7)
    assert targets.dtype == np.float32 and np.allclose(targets.sum(1), 1)
    assert np.allclose(targets[1], [0.3, 0.7, 0.0])  # sample 1 (class 1) with sample 0 (class 0)
    assert np.allclose(targets[0], [0.7, 0.3, 0.0])  # sample 0 with the last (class 1)
    assert np.allclose(images[2], 0.7 * 3 + 0.3 * 2)


def test_cutmix_pastes_the_partners_box_and_weights_by_its_area():
    rng = np.random.default_rng(5)
    images, targets = mixing.cutmix(batch(size=10), mixing.one_hot(LABELS, 3), 0.6, rng)
    pasted = images[2, ..., 0] == 2  # sample 2 (value 3) takes sample 1's (value 2) pixels
    share = pasted.mean()
    assert 0 < share < 1 and np.isin(images[2], [2, 3]).all()
    assert np.allclose(targets[2], [0, share, 1 - share])
    rows, cols = np.nonzero(pasted)
    assert pasted.sum() == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)  # a box
    assert np.allclose(targets.sum(1), 1)


def test_cutmix_box_is_clipped_and_about_the_area():
    rng = np.random.default_rng(0)
    for _ in range(200):
        top, left, bottom, right = mixing.cutmix_box(32, 24, 0.75, rng)
        assert 0 <= top <= bottom <= 32 and 0 <= left <= right <= 24
        assert (bottom - top) * (right - left) <= 0.25 * 32 * 24 + 1


@pytest.mark.parametrize("mix, cut, switch, kind", [(0.2, 0.0, 0.5, "mixup"), (0.0, 1.0, 0.5, "cutmix"),
                                                    (0.2, 1.0, 0.0, "mixup"), (0.2, 1.0, 1.0, "cutmix")])
def test_batch_mix_picks_by_alpha_and_switch(mix, cut, switch, kind):
    mixer = mixing.BatchMix(DataConfig(mixup_alpha=mix, cutmix_alpha=cut, mix_switch_prob=switch), 3, seed=1)
    images, targets = mixer(batch(size=32), LABELS, epoch=0, first_index=7)
    uniform_per_image = all(len(np.unique(img)) == 1 for img in images)
    assert uniform_per_image == (kind == "mixup")  # mixup blends everywhere, cutmix pastes a box
    again = mixer(batch(size=32), LABELS, epoch=0, first_index=7)
    assert np.array_equal(images, again[0]) and np.array_equal(targets, again[1])
    other = mixer(batch(size=32), LABELS, epoch=1, first_index=7)
    assert not np.array_equal(images, other[0])


def test_epoch_batches_give_soft_targets_only_when_mixing_and_training():
    source = ArraySource(np.random.default_rng(0).integers(0, 256, (12, 8, 8), dtype=np.uint8),
                         np.arange(12) % 3)
    data = DataConfig(image_size=8, mixup_alpha=0.4)
    prep, mix = Preprocess(data, 0), mixing.BatchMix(data, 3, 0)
    indices = [np.arange(0, 6), np.arange(6, 12)]
    train = EpochBatches(source, indices, prep, 0, train=True, mix=mix)
    images, targets = train[1]
    assert train.soft_classes == 3 and targets.shape == (6, 3) and targets.dtype == np.float32
    assert np.allclose(targets.sum(1), 1) and images.shape == (6, 8, 8, 3)
    assert np.array_equal(train[1][1], targets)  # read again (another worker): the same
    evaluation = EpochBatches(source, indices, prep, 0, train=False, mix=mix)
    assert evaluation.soft_classes is None and evaluation[0][1].dtype == np.int64
    off = EpochBatches(source, indices, prep, 0, train=True, mix=mixing.BatchMix(DataConfig(image_size=8), 3))
    assert off.soft_classes is None and off[0][1].dtype == np.int64
