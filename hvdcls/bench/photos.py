"""JPEGs made from real photographs, for timing an input pipeline on the pixels it meets.

The photographs are scikit-image's sample images (`skimage.data`, shipped inside its wheel, so
no download): the astronaut, the cat, the coffee cup, the rocket, the Hubble deep field and a
retina. Each JPEG is a random crop of one of them (at least half its area, the size's aspect
ratio), scaled to the size, flipped half the time, and encoded at quality 90, one class per
photograph. The samples are 300-1411 px: an ImageNet-like or 448 px image is at most about 2x
its crop, while a 12 MP one is upscaled 3-13x (bicubic) and carries a grain of +-GRAIN levels
(added where the image is larger than its photograph), without
which an upscaled image is smoother, smaller and faster to decode than a camera's: with it a
12 MP file is about 3 MB, a camera's size at quality 90 (1.3-2 MB with +-4, 0.7-1.7 MB without).

    root/<size>/train/<photo>/<n>.jpg     (written aside and renamed: a root/<size> is complete)
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

JPEG_QUALITY = 90
GRAIN = 12  # levels of uniform noise on upscaled images
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "retina")


@dataclass(frozen=True)
class PhotoSize:
    name: str
    width: int
    height: int
    portrait_share: float = 0.0  # this share of the images is height x width instead


# ImageNet's median photo is 500x375 (a quarter of them portrait); 448 px a side; a 12 MP camera.
SIZES = {"imagenet": PhotoSize("imagenet", 500, 375, portrait_share=0.25),
         "448": PhotoSize("448", 448, 448),
         "12mp": PhotoSize("12mp", 4000, 3000)}


def sample_photos(names: Sequence[str] = PHOTOS) -> dict[str, np.ndarray]:
    """The scikit-image sample photographs, RGB uint8 (requirements/test.txt installs it)."""
    try:
        from skimage import data
    except ImportError as err:
        raise ImportError("the photo set needs scikit-image: pip install -r requirements/test.txt") from err
    return {name: np.ascontiguousarray(getattr(data, name)()[..., :3]) for name in names}


def photo_jpeg(photo: np.ndarray, width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """A random crop of `photo` with the aspect ratio of width x height, covering 50-100% of
    the largest such crop, scaled to width x height, flipped half the time."""
    rows, cols = photo.shape[:2]
    aspect = width / height
    full_w, full_h = (cols, cols / aspect) if cols / rows <= aspect else (rows * aspect, rows)
    side = np.sqrt(rng.uniform(0.5, 1.0))
    crop_w, crop_h = max(1, int(full_w * side)), max(1, int(full_h * side))
    left, top = int(rng.integers(0, cols - crop_w + 1)), int(rng.integers(0, rows - crop_h + 1))
    crop = Image.fromarray(photo[top:top + crop_h, left:left + crop_w])
    image = crop.resize((width, height), Image.Resampling.BICUBIC)
    if max(width, height) > max(rows, cols):
        image = with_grain(image, rng)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return image


def with_grain(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """`image` plus uniform noise of +-GRAIN levels (one 256 px tile, repeated: a 12 MP frame
    of fresh noise costs more to draw than the JPEG costs to write)."""
    width, height = image.size
    tile = rng.integers(-GRAIN, GRAIN + 1, (256, 256, 3), dtype=np.int16)
    noise = np.tile(tile, (height // 256 + 1, width // 256 + 1, 1))[:height, :width]
    return Image.fromarray(np.clip(np.asarray(image, np.int16) + noise, 0, 255).astype(np.uint8))


def write_photo_set(root: Path, size: PhotoSize, count: int, photos: dict[str, np.ndarray],
                    seed: int = 0) -> Path:
    """root/<size.name>/ with `count` JPEGs in train/<photo>/ (photos taking turns), unless a
    complete one with at least `count` is there already. Returns the ImageFolder root."""
    target = root / size.name
    if len(list(target.glob("train/*/*.jpg"))) >= count:
        return target
    tmp = root / f".{size.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng([seed, count])
    names = sorted(photos)
    for index in range(count):
        name = names[index % len(names)]
        width, height = size.width, size.height
        if rng.random() < size.portrait_share:
            width, height = height, width
        folder = tmp / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        photo_jpeg(photos[name], width, height, rng).save(folder / f"{index}.jpg", quality=JPEG_QUALITY)
    shutil.rmtree(target, ignore_errors=True)
    tmp.replace(target)
    return target
