"""Which augmentation preset a run uses: `data.augment.preset`, or for `auto` the data's own size.

ImageNet's random-resized crop (down to 8% of the area) and flips suit photographs; on a
32-pixel image they leave a few pixels of the object, and a flipped letter is another letter.
`auto` measures the native size of a sample of the training images when the data is opened
and picks `small` (no flips) below AUTO_SMALL_BELOW pixels, `imagenet` from there up. The
choice and the size measured are reported in the run's first line and in summary.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from hvdcls.config import DataConfig
from hvdcls.data.bad_files import UnreadableImage
from hvdcls.data.sources import ImageSource

AUTO_SMALL_BELOW = 64  # px, the shorter side: CIFAR-, MNIST-sized images are "small"
SIZE_SAMPLE = 32  # images opened to measure the native size
SIZE_STREAM = 6007  # keeps the sample's generator apart from the others seeded by training.seed
# Formats whose images are made at data.image_size or are known: nothing to measure.
NOT_MEASURED = {"synthetic": "imagenet", "digits": "small"}


@dataclass(frozen=True)
class Choice:
    preset: str  # imagenet | small | none
    reason: str  # "config", or "auto: native 32 px < 64"
    native_size: Optional[int] = None  # median shorter side of the sample, where measured

    def describe(self) -> dict:
        return {"preset": self.preset, "chosen_by": self.reason, "native_size": self.native_size}


def native_size(source: ImageSource, seed: int, sample: int = SIZE_SAMPLE) -> Optional[int]:
    """Median shorter side over a seeded sample of `source`; unreadable files are passed over
    (the data.bad_files policy deals with them when training reads them)."""
    count = min(sample, len(source))
    picks = np.random.default_rng([seed, SIZE_STREAM]).choice(len(source), count, replace=False)
    sides = []
    for index in picks:
        try:
            sides.append(min(source.image(int(index)).size))
        except UnreadableImage:
            continue
    return int(np.median(sides)) if sides else None


def preset_for_size(size: Optional[int]) -> str:
    return "small" if size is not None and size < AUTO_SMALL_BELOW else "imagenet"


def choose(config: DataConfig, data_name: str, source: ImageSource, seed: int) -> Choice:
    """The preset to train with: the configured one, or auto's pick by native size."""
    wanted = config.augment.preset
    if wanted != "auto":
        return Choice(wanted, "config")
    if data_name in NOT_MEASURED:
        return Choice(NOT_MEASURED[data_name], f"auto: {data_name} data")
    size = native_size(source, seed)
    preset = preset_for_size(size)
    relation = "<" if preset == "small" else ">="
    reason = f"auto: native {size} px {relation} {AUTO_SMALL_BELOW}" if size else "auto: size unknown"
    return Choice(preset, reason, size)


def hflip_probability(config: DataConfig, preset: str) -> float:
    """data.augment.hflip when set; otherwise the preset's: 0.5 for imagenet, 0 for the rest."""
    if config.augment.hflip is not None:
        return config.augment.hflip
    return 0.5 if preset == "imagenet" else 0.0
