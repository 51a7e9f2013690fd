"""Opening the configured data set: digits, synthetic, ImageFolder directories and LMDB files.

`open_data` resolves the config (detecting the format of a path) and fails early, with one
line, on a path that cannot be trained on. The sources themselves are hvdcls.data.sources.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hvdcls.config import Config
from hvdcls.data import lmdb_store, presets
from hvdcls.data.bad_files import BadFileLog, CheckedSource
from hvdcls.data.sources import ArraySource, Data, FileSource, SyntheticSource, imagefolder_splits, split_source
from hvdcls.errors import UserError


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


def _open_format(config: Config) -> Data:
    name: str = config.data.name
    path = config.data.path
    if name == "auto":
        name = detect_format(Path(path)) if path else "digits"
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

