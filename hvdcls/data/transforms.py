"""Image preprocessing with Pillow and numpy, shared by both backends.

Both frameworks receive exactly the same pixels: augmentation draws from a generator seeded by
(seed, epoch, sample index), so a batch does not depend on the backend, the number of loader
workers, or whether the run was resumed. A training image goes through the preset's geometry
(hvdcls.data.presets picks it), the flip, data.augment.policy (hvdcls.data.autoaugment),
normalisation, then random erasing.
"""
from __future__ import annotations

from dataclasses import dataclass
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
        aug = self.config.augment
        rng = sample_rng(self.seed, epoch, index)
        out = self.reshape(image, rng)
        if rng.random() < hflip_probability(self.config, self.geometry):
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out = apply_policy(aug.policy, out, rng, aug.num_ops, aug.magnitude)
        return random_erase(self.normalise(out), rng, aug.random_erase)

    def reshape(self, image: Image.Image, rng) -> Image.Image:
        """The preset's crop, resized to image_size."""
        aug, size, geometry = self.config.augment, self.config.image_size, self.geometry
        box = (0, 0, *image.size)
        if geometry == "imagenet" and aug.random_resized_crop:
            box = random_resized_crop_box(*image.size, aug.scale, aug.ratio, rng)
        elif geometry == "small":
            box = random_resized_crop_box(*image.size, SMALL_SCALE, SMALL_RATIO, rng)
        out = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
        if geometry == "small":
            out = pad_and_crop(out, max(1, round(size * SMALL_PAD)), rng)
        return out

    def eval(self, image: Image.Image) -> np.ndarray:
        size = self.config.image_size
        box = centre_crop_box(*image.size, self.config.eval_crop)
        return self.normalise(image.resize((size, size), Image.Resampling.BILINEAR, box=box))

    def normalise(self, image: Image.Image) -> np.ndarray:
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        return (pixels - np.asarray(self.config.mean, np.float32)) / np.asarray(self.config.std, np.float32)
