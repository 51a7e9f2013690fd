"""Image preprocessing with Pillow and numpy, shared by both backends.

Both frameworks receive exactly the same pixels: augmentation draws from a generator seeded by
(seed, epoch, sample index), so a batch does not depend on the backend, the number of loader
workers, or whether the run was resumed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from hvdcls.config import DataConfig


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, int(index)])


def random_resized_crop_box(width: int, height: int, scale, ratio, rng) -> tuple[int, int, int, int]:
    """A box covering a random area fraction in `scale` with aspect ratio in `ratio`.

    Ten tries like the Inception recipe, then the largest centred box within the ratio range.
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
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


@dataclass(frozen=True)
class Preprocess:
    """Turns a PIL image into a normalised float32 HWC array of side `image_size`."""

    config: DataConfig
    seed: int = 0

    def train(self, image: Image.Image, epoch: int, index: int) -> np.ndarray:
        aug, size = self.config.augment, self.config.image_size
        rng = sample_rng(self.seed, epoch, index)
        box = (random_resized_crop_box(*image.size, aug.scale, aug.ratio, rng)
               if aug.random_resized_crop else (0, 0, *image.size))
        out = image.resize((size, size), Image.BILINEAR, box=box)
        if rng.random() < aug.hflip:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return self.normalise(out)

    def eval(self, image: Image.Image) -> np.ndarray:
        size = self.config.image_size
        box = centre_crop_box(*image.size, self.config.eval_crop)
        return self.normalise(image.resize((size, size), Image.BILINEAR, box=box))

    def normalise(self, image: Image.Image) -> np.ndarray:
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        return (pixels - np.asarray(self.config.mean, np.float32)) / np.asarray(self.config.std, np.float32)
