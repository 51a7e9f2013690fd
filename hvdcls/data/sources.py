"""Where images come from: sources that know their length, their labels and how to open
sample i as an RGB PIL image (in memory, synthetic, files on disk), framework-free, and the
ImageFolder layout they are read from. Opening a configured data set is hvdcls.data.datasets.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from hvdcls.data import turbo_jpeg
from hvdcls.data.bad_files import BadFileLog, UnreadableImage
from hvdcls.data.turbo_jpeg import TURNED, Draft
from hvdcls.errors import UserError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
HOLDOUT_STREAM = 7919  # keeps the hold-out split's generator apart from the shuffling one


class ImageSource(Protocol):
    def __len__(self) -> int: ...
    def label(self, index: int) -> int: ...
    # draft: called with the upright image's size before decoding, by a source that can
    # decode smaller (JPEG files); it returns the smallest size wanted (hvdcls.data.transforms.Plan)
    def image(self, index: int, draft: Optional[Draft] = None) -> Image.Image: ...


class LabelledSource:
    """Length and labels of a source that holds one label per sample in `labels`."""

    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def label(self, index: int) -> int:
        return int(self.labels[index])


@dataclass
class ArraySource(LabelledSource):
    """Images held in memory as uint8 arrays (N, H, W) or (N, H, W, 3)."""

    images: np.ndarray
    labels: np.ndarray

    def image(self, index: int, draft: Optional[Draft] = None) -> Image.Image:
        return Image.fromarray(self.images[index]).convert("RGB")


@dataclass
class SyntheticSource:
    """Random pixels, label = index mod classes: for measuring speed, not learning."""

    num_samples: int
    num_classes: int
    image_size: int
    seed: int = 0

    def __len__(self) -> int:
        return self.num_samples

    def label(self, index: int) -> int:
        return int(index) % self.num_classes

    def image(self, index: int, draft: Optional[Draft] = None) -> Image.Image:
        rng = np.random.default_rng([self.seed, int(index)])
        pixels = rng.integers(0, 256, (self.image_size, self.image_size, 3), dtype=np.uint8)
        return Image.fromarray(pixels)


def open_image_bytes(data: bytes, name: str, draft: Optional[Draft] = None) -> Image.Image:
    """The image file's bytes as an RGB image, upright as its EXIF orientation says (a phone's
    photo stored sideways); UnreadableImage naming `name` when it cannot be decoded. A JPEG is
    decoded at the smallest of its scales no smaller than what `draft` asks for, by simplejpeg
    where it is installed (the same pixels, faster: hvdcls.data.turbo_jpeg), else by Pillow."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            fast = turbo_jpeg.decode(image, data, draft)
            if fast is not None:
                return fast
            if draft is not None and image.format == "JPEG":
                reduce_jpeg(image, draft)
            return upright(image).convert("RGB")
    except UnidentifiedImageError:  # its message shows a BytesIO address, not the problem
        raise UnreadableImage(name, "not an image format Pillow can identify") from None
    except Exception as err:
        raise UnreadableImage(name, str(err) or type(err).__name__) from None


def reduce_jpeg(image: Image.Image, draft: Draft) -> None:
    """Sets the not yet decoded JPEG `image` to decode at the smallest scale that gives at
    least the size `draft` wants for its upright size (the header holds both the size and the
    orientation; a turned image's sides swap)."""
    turned = image.getexif().get(ExifTags.Base.Orientation, 1) in TURNED
    width, height = image.size
    want_width, want_height = draft((height, width) if turned else (width, height))
    image.draft(image.mode, (want_height, want_width) if turned else (want_width, want_height))


def upright(image: Image.Image) -> Image.Image:
    """`image` turned as its EXIF orientation tag says. Reading the tag parses only the EXIF
    block the header held (nothing for most files); exif_transpose, which copies the image
    even when there is nothing to turn, runs only for a tag that turns it."""
    if image.getexif().get(ExifTags.Base.Orientation, 1) == 1:
        return image
    return ImageOps.exif_transpose(image)


@dataclass
class FileSource(LabelledSource):
    """Image files on disk (an ImageFolder split)."""

    paths: list[Path]
    labels: np.ndarray

    def image(self, index: int, draft: Optional[Draft] = None) -> Image.Image:
        path = self.paths[index]
        try:
            data = path.read_bytes()
        except OSError as err:
            raise UnreadableImage(str(path), err.strerror or type(err).__name__) from None
        return open_image_bytes(data, str(path), draft)


@dataclass
class Subset:
    source: ImageSource
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def label(self, index: int) -> int:
        return self.source.label(self.indices[index])

    def image(self, index: int, draft: Optional[Draft] = None) -> Image.Image:
        return self.source.image(self.indices[index], draft)


@dataclass
class Data:
    """What training needs: two splits and the class names."""

    name: str  # digits | synthetic | imagefolder | lmdb
    train: ImageSource
    val: ImageSource
    classes: list[str]
    description: dict = field(default_factory=dict)
    bad_files: Optional[BadFileLog] = None  # set by open_data: the data.bad_files policy
    # set by open_data: data.augment.preset resolved, {preset, chosen_by, native_size}
    augment: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def holdout_split(num_samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train, val) index split; val gets round(fraction x N) samples, at least one."""
    order = np.random.default_rng([seed, HOLDOUT_STREAM]).permutation(num_samples)
    n_val = min(num_samples - 1, max(1, round(fraction * num_samples)))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def split_source(source: ImageSource, fraction: float, seed: int):
    train, val = holdout_split(len(source), fraction, seed)
    return Subset(source, train), Subset(source, val)


def scan_classes(root: Path) -> tuple[list[str], list[Path], list[int]]:
    """ImageFolder layout: root/<class>/<image>; classes sorted by name."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise UserError(f"no class directories in {root} (expected {root}/<class>/<image>.jpg)")
    paths: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        files = sorted(f for f in (root / name).rglob("*")
                       if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
        if not files:
            raise UserError(f"class directory {root / name} has no images "
                            f"({', '.join(IMAGE_SUFFIXES[:3])}, ...)")
        paths += files
        labels += [label] * len(files)
    return classes, paths, labels


def imagefolder_splits(root: Path) -> dict[str, tuple[list[str], list[Path], list[int]]]:
    """{'train': scan, 'val': scan} from root/train and root/val, or root itself as train."""
    train_dir = root / "train" if (root / "train").is_dir() else root
    splits = {"train": scan_classes(train_dir)}
    if (root / "val").is_dir():
        splits["val"] = scan_classes(root / "val")
        if splits["val"][0] != splits["train"][0]:
            only_train = sorted(set(splits["train"][0]) - set(splits["val"][0]))
            only_val = sorted(set(splits["val"][0]) - set(splits["train"][0]))
            raise UserError(f"class directories differ between {train_dir} and {root / 'val'}: "
                            f"only in train: {only_train or '-'}, only in val: {only_val or '-'}")
    return splits
