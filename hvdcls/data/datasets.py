"""Opening the configured data set: digits, synthetic, ImageFolder directories and LMDB files.

`open_data` resolves the config (detecting the format of a path) and fails early, with one
line, on a path that cannot be trained on. The sources themselves are hvdcls.data.sources.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

from hvdcls.config import Config
from hvdcls.data import lmdb_store, presets
from hvdcls.data.bad_files import BadFileLog, CheckedSource
from hvdcls.data.sources import ArraySource, Data, FileSource, SyntheticSource, imagefolder_splits, split_source
from hvdcls.errors import UserError
from hvdcls.files.cache import cache_dir
from hvdcls.files.fileio import write_atomic


def digits(config: Config) -> Data:
    """scikit-learn's 1,797 real handwritten digits (8x8, 16 grey levels), shipped with it."""
    images, labels = digits_arrays()
    train, val = split_source(ArraySource(images, labels), config.data.val_fraction, config.training.seed)
    return Data("digits", train, val, [str(d) for d in range(10)],
                {"source": "sklearn.datasets.load_digits", "train": len(train), "val": len(val)})


DIGITS_SHAPE = (1797, 8, 8)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits as uint8 pixels (0-255) and int64 labels, from the user's cache where an
    earlier run left them: importing scikit-learn costs every rank about 1.2 s of CPU (scipy,
    pandas) on the 2-core test machine, a fifth of a digits run to 0.9. Keyed by
    scikit-learn's version; a missing, damaged or unwritable cache only costs that import."""
    path = digits_cache_file()
    cached = read_digits_cache(path) if path else None
    if cached is not None:
        return cached
    from sklearn.datasets import load_digits  # imported here: it is slow and only digits needs it

    bunch = load_digits()
    arrays = (np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8), bunch.target.astype(np.int64))
    if path:
        write_digits_cache(path, *arrays)
    return arrays


def digits_cache_file() -> Optional[Path]:
    from importlib import metadata

    try:
        version = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        return None  # the import below says what is missing
    return cache_dir() / f"digits-sklearn-{version}.npz"


def read_digits_cache(path: Path) -> Optional[tuple[np.ndarray, np.ndarray]]:
    try:
        with np.load(path) as saved:
            images, labels = saved["images"], saved["labels"]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    if images.shape != DIGITS_SHAPE or images.dtype != np.uint8 or labels.shape != DIGITS_SHAPE[:1] \
            or labels.dtype != np.int64:
        return None
    return images, labels


def write_digits_cache(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, images=images, labels=labels)
    try:
        write_atomic(path, buffer.getvalue())  # ranks writing at once each rename a whole file
    except OSError:
        pass  # a read-only home: the next run imports scikit-learn again


def synthetic(config: Config) -> Data:
    syn, size, seed = config.data.synthetic, config.data.image_size, config.training.seed
    train = SyntheticSource(syn.num_samples, syn.num_classes, size, seed)
    val = SyntheticSource(max(syn.num_classes, syn.num_samples // 10), syn.num_classes, size, seed + 1)
    return Data("synthetic", train, val, [f"class{c}" for c in range(syn.num_classes)],
                {"train": len(train), "val": len(val)})


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
    under the data.bad_files policy (hvdcls.data.bad_files), its augmentation preset chosen
    (hvdcls.data.presets: `auto` measures a sample of the images)."""
    data = _open_format(config)
    data.augment = presets.choose(config.data, data.name, data.train, config.training.seed).describe()
    data.bad_files = BadFileLog(config.data.bad_files)
    data.train, data.val = CheckedSource(data.train, data.bad_files), CheckedSource(data.val, data.bad_files)
    return data


def format_name(config: Config) -> str:
    """data.name, with `auto` resolved from data.path (none: the digits)."""
    name: str = config.data.name
    if name == "auto":
        return detect_format(Path(config.data.path)) if config.data.path else "digits"
    return name


def _open_format(config: Config) -> Data:
    name, path = format_name(config), config.data.path
    if name == "digits":
        return digits(config)
    if name == "synthetic":
        return synthetic(config)
    if path is None:
        raise UserError(f"data.name={name} needs data.path")
    root = Path(path)
    if not root.exists():
        raise UserError(f"data path {root} does not exist")
    if name == "imagefolder":
        if not root.is_dir():
            raise UserError(f"data path {root} is not a directory (data.name=imagefolder)")
        return imagefolder(config, root)
    return lmdb_store.open_lmdb(config, root)


def check_num_classes(config: Config, data: Data) -> int:
    """model.num_classes must match the data when both are given."""
    wanted = config.model.num_classes
    if wanted is not None and wanted != data.num_classes:
        raise UserError(f"config model.num_classes={wanted} but the data has {data.num_classes} "
                        f"classes ({', '.join(data.classes[:5])}{', ...' if data.num_classes > 5 else ''})")
    return data.num_classes

