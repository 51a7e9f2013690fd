"""Where images come from: digits, synthetic, ImageFolder directories and LMDB files.

Each source is framework-free: it knows how many samples it has, their labels, and how to
open sample i as an RGB PIL image. `open_data` resolves the config (detecting the format of
a path) and fails early, with one line, on a path that cannot be trained on.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

import numpy as np
from PIL import Image, UnidentifiedImageError

from hvdcls.bad_files import BadFileLog, CheckedSource, UnreadableImage
from hvdcls.config import Config
from hvdcls.errors import UserError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
HOLDOUT_STREAM = 7919  # keeps the hold-out split's generator apart from the shuffling one


class ImageSource(Protocol):
    def __len__(self) -> int: ...
    def label(self, index: int) -> int: ...
    def image(self, index: int) -> Image.Image: ...


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

    def image(self, index: int) -> Image.Image:
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

    def image(self, index: int) -> Image.Image:
        rng = np.random.default_rng([self.seed, int(index)])
        pixels = rng.integers(0, 256, (self.image_size, self.image_size, 3), dtype=np.uint8)
        return Image.fromarray(pixels)


def open_image_bytes(data: bytes, name: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except UnidentifiedImageError:  # its message shows a BytesIO address, not the problem
        raise UnreadableImage(name, "not an image format Pillow can identify") from None
    except Exception as err:  # noqa: BLE001 - decoders of untrusted bytes raise all kinds
        raise UnreadableImage(name, str(err) or type(err).__name__) from None


@dataclass
class FileSource(LabelledSource):
    """Image files on disk (an ImageFolder split)."""

    paths: list[Path]
    labels: np.ndarray

    def image(self, index: int) -> Image.Image:
        path = self.paths[index]
        try:
            data = path.read_bytes()
        except OSError as err:
            raise UnreadableImage(str(path), err.strerror or type(err).__name__) from None
        return open_image_bytes(data, str(path))


@dataclass
class Subset:
    source: ImageSource
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def label(self, index: int) -> int:
        return self.source.label(self.indices[index])

    def image(self, index: int) -> Image.Image:
        return self.source.image(self.indices[index])


@dataclass
class Data:
    """What training needs: two splits and the class names."""

    name: str  # digits | synthetic | imagefolder | lmdb
    train: ImageSource
    val: ImageSource
    classes: list[str]
    description: dict = field(default_factory=dict)
    bad_files: Optional[BadFileLog] = None  # set by open_data: the data.bad_files policy

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


def digits(config: Config) -> Data:
    """scikit-learn's 1,797 real handwritten digits (8x8, 16 grey levels), shipped with it."""
    from sklearn.datasets import load_digits  # imported here: it is slow and only digits needs it

    bunch = load_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    train, val = split_source(ArraySource(images, bunch.target.astype(np.int64)),
                              config.data.val_fraction, config.training.seed)
    return Data("digits", train, val, [str(d) for d in range(10)],
                {"source": "sklearn.datasets.load_digits", "train": len(train), "val": len(val)})


def synthetic(config: Config) -> Data:
    syn, size, seed = config.data.synthetic, config.data.image_size, config.training.seed
    train = SyntheticSource(syn.num_samples, syn.num_classes, size, seed)
    val = SyntheticSource(max(syn.num_classes, syn.num_samples // 10), syn.num_classes, size, seed + 1)
    return Data("synthetic", train, val, [f"class{c}" for c in range(syn.num_classes)],
                {"train": len(train), "val": len(val)})


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


def imagefolder(config: Config, root: Path) -> Data:
    splits = imagefolder_splits(root)
    classes, paths, labels = splits["train"]
    train_source = FileSource(paths, np.asarray(labels, np.int64))
    if "val" in splits:
        _, val_paths, val_labels = splits["val"]
        train, val = train_source, FileSource(val_paths, np.asarray(val_labels, np.int64))
    else:
        train, val = split_source(train_source, config.data.val_fraction, config.training.seed)
    return Data("imagefolder", train, val, classes,
                {"path": str(root), "train": len(train), "val": len(val),
                 "val_from": "val/" if "val" in splits else f"{config.data.val_fraction:g} of train/"})


def detect_format(path: Path) -> str:
    if not path.exists():
        raise UserError(f"data path {path} does not exist")
    if path.is_dir():
        return "lmdb" if (path / "data.mdb").is_file() else "imagefolder"
    return "lmdb"


def open_data(config: Config) -> Data:
    """The configured data set, its format detected from data.path when data.name=auto, read
    under the data.bad_files policy (hvdcls.bad_files)."""
    data = _open_format(config)
    data.bad_files = BadFileLog(config.data.bad_files)
    data.train, data.val = CheckedSource(data.train, data.bad_files), CheckedSource(data.val, data.bad_files)
    return data


def _open_format(config: Config) -> Data:
    name, path = config.data.name, config.data.path
    if name == "auto":
        name = detect_format(Path(path)) if path else "digits"
    if name == "digits":
        return digits(config)
    if name == "synthetic":
        return synthetic(config)
    root = Path(path)
    if not root.exists():
        raise UserError(f"data path {root} does not exist")
    if name == "imagefolder":
        if not root.is_dir():
            raise UserError(f"data path {root} is not a directory (data.name=imagefolder)")
        return imagefolder(config, root)
    from hvdcls import lmdb_store

    return lmdb_store.open_lmdb(config, root)


def check_num_classes(config: Config, data: Data) -> int:
    """model.num_classes must match the data when both are given."""
    wanted = config.model.num_classes
    if wanted is not None and wanted != data.num_classes:
        raise UserError(f"config model.num_classes={wanted} but the data has {data.num_classes} "
                        f"classes ({', '.join(data.classes[:5])}{', ...' if data.num_classes > 5 else ''})")
    return data.num_classes

