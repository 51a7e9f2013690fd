"""JPEG's scaled decoding before the crop (hvdcls.data.transforms.Plan with
hvdcls.data.sources.open_image_bytes): a large photo is decoded at the smallest scale that still
gives the crop box image_size pixels a side; the random draws do not depend on it; the pixels
stay close to a full decode's; a small image decodes whole and comes out exactly as before."""
import numpy as np
import pytest

from hvdcls.config import load
from hvdcls.data.sources import open_image_bytes
from hvdcls.data.transforms import Preprocess
from tests.unit.test_sources_exif import jpeg


def photo_like(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth shapes at several scales, as a photo has (flat noise would make any decoder's
    filtering look worse than on a photo): a sum of random low-frequency waves."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.zeros((height, width, 3), np.float32)
    for _ in range(12):
        fx, fy = rng.uniform(0.5, 12, 2) / max(width, height)
        phase, channel_mix = rng.uniform(0, 2 * np.pi), rng.uniform(0, 1, 3)
        out += np.sin(2 * np.pi * (fx * x + fy * y) + phase)[..., None] * channel_mix
    out = (out - out.min()) / (out.max() - out.min())
    return (255 * out).astype(np.uint8)


def preprocess(size: int = 32, **augment) -> Preprocess:
    overrides = [f"data.image_size={size}", "data.augment.preset=imagenet"]
    overrides += [f"data.augment.{key}={value}" for key, value in augment.items()]
    return Preprocess(load(overrides=overrides).data, seed=3)


def both_ways(prep: Preprocess, data: bytes, train: bool, index: int = 5):
    """The sample decoded through its plan (maybe reduced) and decoded whole, and the plan."""
    plan, decoded = prep.plan(2, index, train), []

    def draft(size):
        wanted = plan.draft(size)
        decoded.append(size)
        return wanted

    reduced = open_image_bytes(data, "photo.jpg", draft)
    whole = open_image_bytes(data, "photo.jpg")
    expected = prep.train(whole, 2, index) if train else prep.eval(whole)
    return plan.finish(reduced), expected, reduced.size, whole.size, decoded


@pytest.mark.parametrize("train", [True, False])
def test_a_large_photo_is_decoded_reduced_and_comes_out_close_to_a_full_decode(train):
    prep = preprocess(size=32, random_resized_crop="true")
    got, expected, reduced, whole, asked = both_ways(prep, jpeg(photo_like(1600, 1200)), train)
    assert asked == [whole] == [(1600, 1200)]
    assert reduced[0] <= whole[0] // 4 and reduced[1] <= whole[1] // 4  # 1/4 or 1/8 of each side
    assert got.shape == expected.shape == (32, 32, 3)
    # normalised units (ImageNet's std: 1.0 is about 57 of 255): the decoder's box filter and
    # the bilinear resize from a quarter-size image differ by a few levels of 255
    assert np.abs(got - expected).mean() < 0.05 and np.abs(got - expected).max() < 0.6


def test_the_draws_do_not_depend_on_the_decode():
    """Each draft starts the sample's draws afresh (a replaced unreadable file asks again), and
    the box, flip and erasing follow from (seed, epoch, index) alone."""
    prep = preprocess(size=32, random_resized_crop="true", random_erase=0.5)
    plan = prep.plan(2, 7, train=True)
    first = plan.draft((1600, 1200)), plan.box
    assert (plan.draft((1600, 1200)), plan.box) == first
    pixels = photo_like(1600, 1200)
    got, expected, *_ = both_ways(prep, jpeg(pixels), True, index=7)
    erased_got, erased_expected = np.all(got == 0, axis=2), np.all(expected == 0, axis=2)
    assert np.array_equal(erased_got, erased_expected)  # the same erased patch, if any


def test_a_small_image_decodes_whole_and_exactly_as_before():
    prep = preprocess(size=32)
    data = jpeg(photo_like(40, 36))
    for train in (True, False):
        got, expected, reduced, whole, _ = both_ways(prep, data, train)
        assert reduced == whole and np.array_equal(got, expected)


def test_a_turned_photo_asks_with_its_upright_size_and_is_cropped_upright():
    """Stored 1600x1200 with orientation 6 (turned a quarter): upright 1200x1600."""
    prep = preprocess(size=32, random_resized_crop="false")  # the whole image: easy to compare
    pixels = photo_like(1600, 1200)
    got, expected, reduced, whole, asked = both_ways(prep, jpeg(pixels, orientation=6), True)
    assert asked == [(1200, 1600)] and whole == (1200, 1600) and reduced[1] > reduced[0]
    assert np.abs(got - expected).mean() < 0.05
