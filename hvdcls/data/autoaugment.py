"""Learned and random augmentation policies with Pillow, drawn from the per-sample generator.

RandAugment (Cubuk et al. 2020), TrivialAugmentWide (Müller & Hutter 2021) and AutoAugment's
ImageNet policy (Cubuk et al. 2019), with the magnitude ranges torchvision's
`transforms.autoaugment` uses, and random erasing (Zhong et al. 2020). Every draw comes from
the generator the caller passes (hvdcls.data.transforms.sample_rng), so an image's result
depends only on (seed, epoch, sample index): not on the backend, the loader's workers, or
a resume. Geometric ops fill with black and sample the nearest pixel, as torchvision's do.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from hvdcls.data.boxes import random_box

RANDAUGMENT_BINS = 31  # magnitude 0..30, torchvision's default
AUTOAUGMENT_BINS = 10  # the AutoAugment paper's discretisation


def _affine(image: Image.Image, coefficients: tuple) -> Image.Image:
    """Pillow's affine maps each output pixel to an input one; black outside the image."""
    return image.transform(image.size, Image.Transform.AFFINE, coefficients, resample=Image.Resampling.NEAREST,
                           fillcolor=(0, 0, 0))


def shear_x(image: Image.Image, amount: float) -> Image.Image:
    half = image.size[1] / 2  # about the centre row, so the picture stays in frame
    return _affine(image, (1, amount, -amount * half, 0, 1, 0))


def shear_y(image: Image.Image, amount: float) -> Image.Image:
    half = image.size[0] / 2
    return _affine(image, (1, 0, 0, amount, 1, -amount * half))


def translate_x(image: Image.Image, pixels: float) -> Image.Image:
    return _affine(image, (1, 0, -round(pixels), 0, 1, 0))


def translate_y(image: Image.Image, pixels: float) -> Image.Image:
    return _affine(image, (1, 0, 0, 0, 1, -round(pixels)))


def rotate(image: Image.Image, degrees: float) -> Image.Image:
    return image.rotate(degrees, resample=Image.Resampling.NEAREST, fillcolor=(0, 0, 0))


def _enhance(kind) -> Callable[[Image.Image, float], Image.Image]:
    return lambda image, amount: kind(image).enhance(1.0 + amount)


# name -> (op(image, magnitude), signed: a magnitude may be negated at random)
OPS: dict[str, tuple[Callable[[Image.Image, float], Image.Image], bool]] = {
    "Identity": (lambda image, _: image, False),
    "ShearX": (shear_x, True),
    "ShearY": (shear_y, True),
    "TranslateX": (translate_x, True),
    "TranslateY": (translate_y, True),
    "Rotate": (rotate, True),
    "Brightness": (_enhance(ImageEnhance.Brightness), True),
    "Color": (_enhance(ImageEnhance.Color), True),
    "Contrast": (_enhance(ImageEnhance.Contrast), True),
    "Sharpness": (_enhance(ImageEnhance.Sharpness), True),
    "Posterize": (lambda image, bits: ImageOps.posterize(image, int(bits)), False),
    "Solarize": (lambda image, threshold: ImageOps.solarize(image, int(threshold)), False),
    "AutoContrast": (lambda image, _: ImageOps.autocontrast(image), False),
    "Equalize": (lambda image, _: ImageOps.equalize(image), False),
    "Invert": (lambda image, _: ImageOps.invert(image), False),
}


@functools.lru_cache(maxsize=16)  # per image otherwise; images come in a few sizes, callers only read
def magnitudes(space: str, bins: int, width: int, height: int) -> dict[str, np.ndarray]:
    """Each op's magnitude for bin 0..bins-1. space: 'standard' (RandAugment, AutoAugment)
    or 'wide' (TrivialAugmentWide's larger ranges)."""
    wide = space == "wide"
    colour = np.linspace(0.0, 0.99 if wide else 0.9, bins)
    levels = 6 if wide else 4  # posterize keeps 8 bits down to 8 - levels
    return {
        "Identity": np.zeros(bins),
        "ShearX": np.linspace(0.0, 0.99 if wide else 0.3, bins),
        "ShearY": np.linspace(0.0, 0.99 if wide else 0.3, bins),
        "TranslateX": np.linspace(0.0, 32.0 if wide else 150.0 / 331.0 * width, bins),
        "TranslateY": np.linspace(0.0, 32.0 if wide else 150.0 / 331.0 * height, bins),
        "Rotate": np.linspace(0.0, 135.0 if wide else 30.0, bins),
        "Brightness": colour, "Color": colour, "Contrast": colour, "Sharpness": colour,
        "Posterize": 8 - np.round(np.arange(bins) / ((bins - 1) / levels)),
        "Solarize": np.linspace(255.0, 0.0, bins),
        "AutoContrast": np.zeros(bins), "Equalize": np.zeros(bins), "Invert": np.zeros(bins),
    }


def apply_op(image: Image.Image, name: str, magnitude: float, rng: np.random.Generator) -> Image.Image:
    op, signed = OPS[name]
    if signed and rng.random() < 0.5:
        magnitude = -magnitude
    return op(image, float(magnitude))


RANDAUGMENT_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate",
                   "Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize",
                   "AutoContrast", "Equalize")


def rand_augment(image: Image.Image, rng: np.random.Generator, num_ops: int = 2,
                 magnitude: int = 9) -> Image.Image:
    """num_ops ops drawn uniformly (with replacement), each at bin `magnitude` of 31."""
    table = magnitudes("standard", RANDAUGMENT_BINS, *image.size)
    for _ in range(num_ops):
        name = RANDAUGMENT_OPS[int(rng.integers(len(RANDAUGMENT_OPS)))]
        image = apply_op(image, name, table[name][magnitude], rng)
    return image


def trivial_augment(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """One op, drawn uniformly, at a magnitude bin drawn uniformly (the wide ranges)."""
    table = magnitudes("wide", RANDAUGMENT_BINS, *image.size)
    name = RANDAUGMENT_OPS[int(rng.integers(len(RANDAUGMENT_OPS)))]
    return apply_op(image, name, table[name][int(rng.integers(RANDAUGMENT_BINS))], rng)


# AutoAugment's ImageNet policy as published (Cubuk et al. 2019, appendix): 25 sub-policies of
# two (op, probability, magnitude bin of 10) steps; None: the op takes no magnitude.
IMAGENET_POLICY: tuple[tuple[tuple[str, float, Optional[int]], ...], ...] = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)


def auto_augment(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """One sub-policy of the ImageNet policy, drawn uniformly; each step applied with its
    probability. Posterize's bins here keep 8 bits down to 4, as torchvision's do."""
    table = magnitudes("standard", AUTOAUGMENT_BINS, *image.size)
    policy = IMAGENET_POLICY[int(rng.integers(len(IMAGENET_POLICY)))]
    for name, probability, level in policy:
        if rng.random() < probability:
            image = apply_op(image, name, 0.0 if level is None else table[name][level], rng)
    return image


def apply_policy(policy: str, image: Image.Image, rng: np.random.Generator, num_ops: int,
                 magnitude: int) -> Image.Image:
    """data.augment.policy on an RGB image (none: the image itself, and no draw)."""
    if policy == "randaugment":
        return rand_augment(image, rng, num_ops, magnitude)
    if policy == "trivialaugment":
        return trivial_augment(image, rng)
    if policy == "autoaugment":
        return auto_augment(image, rng)
    return image


def random_erase(pixels: np.ndarray, rng: np.random.Generator, probability: float,
                 scale=(0.02, 0.33), ratio=(0.3, 3.3)) -> np.ndarray:
    """With `probability`, zero one box of HWC `pixels` (normalised: 0 is the mean colour)
    covering a fraction in `scale` of the area at an aspect ratio in `ratio`; ten tries."""
    if probability <= 0 or rng.random() >= probability:
        return pixels
    height, width = pixels.shape[:2]
    drawn = random_box(height, width, scale, ratio, rng, whole=False)  # (height, width)
    if drawn is None:
        return pixels
    top, left, h, w = drawn
    erased = pixels.copy()
    erased[top:top + h, left:left + w] = 0.0
    return erased
