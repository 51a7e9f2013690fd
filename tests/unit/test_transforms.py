"""hvdcls.data.transforms: crop boxes, seeded augmentation, normalisation, the eval centre crop."""
import hashlib

import numpy as np
import pytest
from PIL import Image

from hvdcls.config import AugmentConfig, DataConfig
from hvdcls.data.transforms import Preprocess, centre_crop_box, random_resized_crop_box, sample_rng

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def noise_image(width=40, height=30, seed=0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def data_config(**kwargs) -> DataConfig:
    augment = kwargs.pop("augment", {})
    return DataConfig(augment=AugmentConfig(**augment), **kwargs)


# --- crop boxes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("width, height", [(1, 1), (2, 50), (50, 2), (8, 8), (12, 12), (224, 160),
                                           (640, 480), (33, 1000)])
@pytest.mark.parametrize("scale, ratio", [(SCALE, RATIO), ((0.7, 1.0), (0.8, 1.25)),
                                          ((1.0, 1.0), (1.0, 1.0)), ((0.01, 0.02), (0.1, 10.0))])
def test_random_resized_crop_box_inside_image(width, height, scale, ratio):
    rng = np.random.default_rng(123)
    for _ in range(200):
        left, top, right, bottom = random_resized_crop_box(width, height, scale, ratio, rng)
        assert all(isinstance(v, int) for v in (left, top, right, bottom))
        assert 0 <= left < right <= width
        assert 0 <= top < bottom <= height


def test_random_resized_crop_box_respects_scale_and_ratio():
    rng = np.random.default_rng(0)
    for _ in range(300):
        left, top, right, bottom = random_resized_crop_box(400, 300, (0.3, 0.5), (0.75, 4 / 3), rng)
        w, h = right - left, bottom - top
        area = w * h / (400 * 300)
        assert 0.29 <= area <= 0.51  # every try fits: no fallback; rounding moves it a little
        assert 0.73 <= w / h <= 1.36


def test_random_resized_crop_box_is_deterministic():
    def boxes(seed):
        rng = np.random.default_rng(seed)
        return [random_resized_crop_box(97, 61, SCALE, RATIO, rng) for _ in range(50)]

    assert boxes(4) == boxes(4)
    assert boxes(4) != boxes(5)


def test_random_resized_crop_boxes_for_a_seed_are_pinned():
    """The crop a seed gives must not move with a refactoring: a digest of boxes over sizes,
    scales and ratios (some never fitting: the fallback), 100 seeds each, with the generator's
    next draw."""
    digest = hashlib.sha256()
    for size in ((97, 61), (8, 8), (2, 50), (640, 480)):
        for scale, ratio in ((SCALE, RATIO), ((0.01, 0.02), (0.1, 10.0)), ((0.9, 1.0), (0.5, 0.6))):
            for seed in range(100):
                rng = np.random.default_rng(seed)
                digest.update(repr(random_resized_crop_box(*size, scale, ratio, rng)).encode())
                digest.update(str(rng.integers(1 << 30)).encode())
    assert digest.hexdigest() == "d8e3cd2e1c61a1a2fb561f55cfc1a092d2a8aa17e35bf8e521e948f6bd34bbe4"


def test_random_resized_crop_fallback_is_centred_within_ratio():
    class NeverFits:  # every try asks for more than the image, so the fallback is used
        def uniform(self, low, high):
            return high * 100

        def integers(self, low, high):
            raise AssertionError("not reached")

    assert random_resized_crop_box(100, 10, (1.0, 1.0), RATIO, NeverFits()) == (43, 0, 56, 10)
    assert random_resized_crop_box(10, 100, (1.0, 1.0), RATIO, NeverFits()) == (0, 43, 10, 56)
    assert random_resized_crop_box(50, 40, (1.0, 1.0), RATIO, NeverFits()) == (0, 0, 50, 40)


@pytest.mark.parametrize("width, height, fraction, box", [
    (100, 60, 0.5, (35, 15, 65, 45)),
    (20, 20, 0.5, (5, 5, 15, 15)),
    (8, 8, 1.0, (0, 0, 8, 8)),
    (224, 256, 0.875, (14, 30, 210, 226)),
    (3, 3, 0.1, (1, 1, 2, 2)),
])
def test_centre_crop_box(width, height, fraction, box):
    assert centre_crop_box(width, height, fraction) == box


def test_sample_rng_is_keyed_by_seed_epoch_index():
    draw = lambda *key: sample_rng(*key).random(4).tolist()  # noqa: E731
    assert draw(0, 1, 2) == draw(0, 1, 2)
    assert draw(0, 1, 2) == draw(0, 1, np.int64(2))
    assert len({tuple(draw(*k)) for k in [(0, 1, 2), (1, 1, 2), (0, 2, 2), (0, 1, 3)]}) == 4


# --- Preprocess ---------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [8, 16, 32])
def test_train_output_shape_and_dtype(size):
    out = Preprocess(data_config(image_size=size)).train(noise_image(), epoch=0, index=3)
    assert out.shape == (size, size, 3)
    assert out.dtype == np.float32


def test_train_is_deterministic_per_seed_epoch_index():
    pre = Preprocess(data_config(image_size=16), seed=3)
    image = noise_image()
    first = pre.train(image, epoch=2, index=5)
    assert np.array_equal(first, pre.train(image, epoch=2, index=5))
    assert np.array_equal(first, Preprocess(data_config(image_size=16), seed=3).train(image, 2, 5))
    assert not np.array_equal(first, pre.train(image, epoch=3, index=5))
    assert not np.array_equal(first, pre.train(image, epoch=2, index=6))
    assert not np.array_equal(first, Preprocess(data_config(image_size=16), seed=4).train(image, 2, 5))


def test_train_without_crop_or_flip_is_a_plain_resize():
    cfg = data_config(image_size=20, mean=[0.0] * 3, std=[1.0] * 3,
                      augment={"random_resized_crop": False, "hflip": 0.0})
    image = noise_image(20, 20)
    out = Preprocess(cfg).train(image, epoch=0, index=0)
    expected = np.asarray(image, np.float32) / 255.0
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_hflip_probability_one_always_mirrors():
    base = {"random_resized_crop": False}
    plain = data_config(image_size=12, augment={**base, "hflip": 0.0})
    flipped = data_config(image_size=12, augment={**base, "hflip": 1.0})
    image = noise_image(12, 12)
    for index in range(5):
        a = Preprocess(plain).train(image, 0, index)
        b = Preprocess(flipped).train(image, 0, index)
        assert np.array_equal(b, a[:, ::-1, :])
        assert not np.array_equal(a, b)


def test_normalise_maths():
    mean, std = [0.5, 0.25, 0.0], [0.5, 0.25, 2.0]
    pre = Preprocess(data_config(mean=mean, std=std))
    pixels = np.array([[[0, 0, 0], [255, 255, 255]], [[51, 102, 204], [128, 64, 32]]], np.uint8)
    out = pre.normalise(Image.fromarray(pixels))
    assert out.dtype == np.float32 and out.shape == (2, 2, 3)
    expected = (pixels.astype(np.float64) / 255.0 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[0, 0], [-1.0, -1.0, 0.0], atol=1e-7)
    np.testing.assert_allclose(out[0, 1], [1.0, 3.0, 0.5], atol=1e-6)


@pytest.mark.parametrize("mean, std", [(None, None), ([0.5] * 3, [0.5] * 3), ([0.2, 0.1, 0.7], [0.3, 1.2, 0.05])])
def test_normalise_by_table_is_the_float32_arithmetic_bit_for_bit(mean, std):
    """Every level of every channel: the table's floats are those (x / 255 - mean) / std gives
    in float32, so runs before and after the table see the same inputs."""
    config = DataConfig() if mean is None else data_config(mean=mean, std=std)
    levels = np.arange(256, dtype=np.uint8)
    pixels = np.stack([levels, levels[::-1], np.roll(levels, 7)], axis=-1).reshape(16, 16, 3)
    out = Preprocess(config).normalise(Image.fromarray(pixels))
    arithmetic = (np.asarray(pixels, np.float32) / 255.0 - np.asarray(config.mean, np.float32)) / \
        np.asarray(config.std, np.float32)
    assert out.dtype == np.float32 and np.array_equal(out, arithmetic)


def test_normalise_with_imagenet_defaults():
    out = Preprocess(DataConfig()).normalise(Image.new("RGB", (1, 1), (255, 0, 128)))
    expected = [(1.0 - 0.485) / 0.229, (0.0 - 0.456) / 0.224, (128 / 255 - 0.406) / 0.225]
    np.testing.assert_allclose(out[0, 0], expected, rtol=1e-6)


def test_eval_centre_crop():
    image = Image.new("RGB", (20, 20), (0, 0, 255))
    image.paste((255, 0, 0), (5, 5, 15, 15))  # the centre half is red
    cfg = data_config(image_size=10, eval_crop=0.5, mean=[0.0] * 3, std=[1.0] * 3)
    out = Preprocess(cfg).eval(image)
    assert out.shape == (10, 10, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, np.broadcast_to([1.0, 0.0, 0.0], (10, 10, 3)), atol=1e-6)


def test_eval_is_deterministic_and_ignores_augmentation():
    image = noise_image(37, 29)
    a = Preprocess(data_config(image_size=16, augment={"hflip": 1.0}), seed=1).eval(image)
    b = Preprocess(data_config(image_size=16, augment={"hflip": 0.0}), seed=2).eval(image)
    assert np.array_equal(a, b)


def test_eval_full_frame_when_crop_is_one():
    cfg = data_config(image_size=12, eval_crop=1.0, mean=[0.0] * 3, std=[1.0] * 3)
    image = noise_image(12, 12)
    np.testing.assert_allclose(Preprocess(cfg).eval(image), np.asarray(image, np.float32) / 255.0,
                               atol=1e-6)
