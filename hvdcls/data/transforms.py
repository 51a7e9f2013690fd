"""Image preprocessing with Pillow and numpy, shared by both backends.

Both frameworks receive exactly the same pixels: augmentation draws from a generator seeded by
(seed, epoch, sample index), so a batch does not depend on the backend, the number of loader
workers, or whether the run was resumed. A training image goes through the preset's geometry
(hvdcls.data.presets picks it), the flip, data.augment.policy (hvdcls.data.autoaugment),
normalisation, then random erasing.

A sample's crop box is drawn before its image is decoded (`Preprocess.plan`): a source that
can (a JPEG file, hvdcls.data.sources.open_image_bytes) asks the plan, with the size in the
header, how large the decoded image must be for the box to still hold `image_size` pixels a
side, and decodes at the smallest of JPEG's scales (1/2, 1/4, 1/8) that does. The random draws
are the same whatever the source does; the pixels of a reduced decode differ from a full one's
by the decoder's scaling, which is a box filter over 2x2, 4x4 or 8x8 pixels before our own
bilinear resize.

A sample that needs no float work (no random erasing) can stop at its uint8 pixels
(`Plan.finish(image, uint8=True)`): a backend then normalises the batch after the loader
hands it over, to the same floats (hvdcls.data.batches.EpochBatches.read).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import numpy as np
from PIL import Image

from hvdcls.config import DataConfig
from hvdcls.data.autoaugment import apply_policy, random_erase
from hvdcls.data.boxes import random_box
from hvdcls.data.presets import hflip_probability

SMALL_SCALE = (0.8, 1.0)  # the small preset's zoom: at least 80% of the area stays
SMALL_RATIO = (0.9, 1 / 0.9)
SMALL_PAD = 1 / 8  # ... and a translation by up to 1/8 of the side (4 px at 32, as for CIFAR)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, int(index)])


def random_resized_crop_box(width: int, height: int, scale, ratio, rng) -> tuple[int, int, int, int]:
    """A box covering a random area fraction in `scale` with aspect ratio in `ratio`.

    Ten tries like the Inception recipe, then the largest centred box within the ratio range.
    """
    drawn = random_box(width, height, scale, ratio, rng)
    if drawn is not None:
        left, top, w, h = drawn
        return left, top, left + w, top + h
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def centre_crop_box(width: int, height: int, crop_fraction: float) -> tuple[int, int, int, int]:
    """The centred square whose side is `crop_fraction` of the shorter side."""
    side = max(1, round(min(width, height) * crop_fraction))
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def pad_and_crop(image: Image.Image, pad: int, rng) -> Image.Image:
    """`image` shifted by up to `pad` pixels each way, black where it moved in from."""
    width, height = image.size
    canvas = Image.new("RGB", (width + 2 * pad, height + 2 * pad))
    canvas.paste(image, (pad, pad))
    left, top = int(rng.integers(0, 2 * pad + 1)), int(rng.integers(0, 2 * pad + 1))
    return canvas.crop((left, top, left + width, top + height))


@dataclass(frozen=True)
class Preprocess:
    """Turns a PIL image into a normalised float32 HWC array of side `image_size`.

    `preset`: the resolved data.augment.preset (hvdcls.data.presets.choose); None takes the
    config's, where `auto`, unresolved, stands for imagenet."""

    config: DataConfig
    seed: int = 0
    preset: Optional[str] = None

    @property
    def geometry(self) -> str:
        preset = self.preset or self.config.augment.preset
        return "imagenet" if preset == "auto" else preset

    def train(self, image: Image.Image, epoch: int, index: int) -> np.ndarray:
        return self.plan(epoch, index, train=True).finish(image)

    def eval(self, image: Image.Image) -> np.ndarray:
        return self.plan(0, 0, train=False).finish(image)

    def plan(self, epoch: int, index: int, train: bool) -> "Plan":
        """Sample `index`'s preprocessing, to be drawn from the image's size (Plan.draft) before
        it is decoded, or from the decoded image (Plan.finish) when the source cannot."""
        return Plan(self, epoch, index, train)

    def crop_box(self, width: int, height: int, rng) -> tuple[int, int, int, int]:
        """The preset's crop of a training image of this size (the first of its draws)."""
        aug, geometry = self.config.augment, self.geometry
        if geometry == "imagenet" and aug.random_resized_crop:
            return random_resized_crop_box(width, height, aug.scale, aug.ratio, rng)
        if geometry == "small":
            return random_resized_crop_box(width, height, SMALL_SCALE, SMALL_RATIO, rng)
        return 0, 0, width, height

    def augment(self, crop: Image.Image, rng) -> np.ndarray:
        """A training crop, resized to image_size: the rest of the preset, the flip, the
        policy, normalisation and random erasing."""
        return random_erase(self.normalise(self.augment_pixels(crop, rng)), rng, self.config.augment.random_erase)

    def augment_pixels(self, crop: Image.Image, rng) -> Image.Image:
        """What of `augment` works on uint8 pixels: the rest of the preset, the flip, the policy."""
        aug, size = self.config.augment, self.config.image_size
        if self.geometry == "small":
            crop = pad_and_crop(crop, max(1, round(size * SMALL_PAD)), rng)
        if rng.random() < hflip_probability(self.config, self.geometry):
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return apply_policy(aug.policy, crop, rng, aug.num_ops, aug.magnitude)

    def device_ok(self, train: bool) -> bool:
        """Whether a sample's preprocessing is only the crop, the resize and the flip, which a
        backend can apply on its device to an image it decoded there (data.decode=gpu:
        hvdcls.data.device_decode): evaluation's centre crop, or a training crop without the
        small preset's pad, a policy or random erasing."""
        if not train:
            return True
        return self.geometry != "small" and self.config.augment.policy == "none" and not self.floats_only(train)

    def floats_only(self, train: bool) -> bool:
        """Whether a sample needs float work after normalising (random erasing of a training
        crop), so that it cannot be handed over as uint8 pixels (Plan.finish)."""
        return train and self.config.augment.random_erase > 0

    def normalise(self, image: Image.Image) -> np.ndarray:
        """(pixel / 255 - mean) / std in float32, read from a table of the 256 values each
        channel can take: the same floats as the arithmetic (the table is that arithmetic),
        in a quarter of its time (a gather instead of three passes over float temporaries)."""
        pixels = np.asarray(image)
        out = np.empty(pixels.shape, np.float32)
        for channel, table in enumerate(self.channel_tables):
            np.take(table, pixels[..., channel], out=out[..., channel])
        return out

    @cached_property
    def channel_tables(self) -> np.ndarray:
        """(3, 256) float32: channel c's normalised value of each uint8 level."""
        levels = np.arange(256, dtype=np.float32)[:, None] / 255.0
        mean, std = np.asarray(self.config.mean, np.float32), np.asarray(self.config.std, np.float32)
        return np.ascontiguousarray(((levels - mean) / std).T)


class Plan:
    """One sample's preprocessing, begun before its image is decoded. `draft(size)` draws the
    crop box from the upright image's size and returns the smallest decoded size that still
    gives the box image_size pixels a side; `finish(image)` crops the (maybe reduced) image
    there and does the rest. A source may call draft more than once (hvdcls.data.bad_files
    reads another file when one fails): each call starts the sample's draws afresh."""

    def __init__(self, preprocess: Preprocess, epoch: int, index: int, train: bool):
        self.preprocess, self.epoch, self.index, self.train = preprocess, epoch, index, train
        self.size: Optional[tuple[int, int]] = None  # the full image's, once drawn
        self.box: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.rng: Optional[np.random.Generator] = None

    def draft(self, size: tuple[int, int]) -> tuple[int, int]:
        prep, (width, height) = self.preprocess, size
        self.size = size
        if self.train:
            self.rng = sample_rng(prep.seed, self.epoch, self.index)
            self.box = prep.crop_box(width, height, self.rng)
        else:
            self.box = centre_crop_box(width, height, prep.config.eval_crop)
        side = prep.config.image_size
        left, top, right, bottom = self.box
        # the whole image at the scale where the box's sides are image_size (never above full)
        return (min(width, math.ceil(width * side / max(1, right - left))),
                min(height, math.ceil(height * side / max(1, bottom - top))))

    def device_flip(self) -> bool:
        """After `draft`, for a sample that is device_ok: whether it is mirrored, drawn as
        Preprocess.augment_pixels draws it (the one draw after the box)."""
        if not self.train:
            return False
        assert self.rng is not None
        return bool(self.rng.random() < hflip_probability(self.preprocess.config, self.preprocess.geometry))

    def finish(self, image: Image.Image, uint8: bool = False) -> np.ndarray:
        """The sample as float32 normalised HWC, or with `uint8` (where Preprocess.floats_only
        allows it) its uint8 pixels before normalising: the backend normalises them after the
        hand-over, a quarter of the bytes through the loader's queue."""
        if self.size is None:  # the source decoded it whole without asking
            self.draft(image.size)
        assert self.size is not None
        box = scaled_box(self.box, self.size, image.size)
        side = self.preprocess.config.image_size
        crop = image.resize((side, side), Image.Resampling.BILINEAR, box=box)
        if self.train:
            assert self.rng is not None
            if not uint8:
                return self.preprocess.augment(crop, self.rng)
            crop = self.preprocess.augment_pixels(crop, self.rng)
        return np.asarray(crop) if uint8 else self.preprocess.normalise(crop)


def scaled_box(box: tuple[int, int, int, int], full: tuple[int, int], decoded: tuple[int, int]):
    """`box`, drawn on an image of size `full`, on the same image decoded at `decoded` (a
    JPEG's reduced decode rounds its sides up: the ratio of the sizes, not the scale)."""
    if decoded == full:
        return box
    sx, sy = decoded[0] / full[0], decoded[1] / full[1]
    left, top, right, bottom = box
    return left * sx, top * sy, right * sx, bottom * sy
