"""hvdcls.data.datasets and hvdcls.data.lmdb_store on real image files written with Pillow."""
import gc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hvdcls import config
from hvdcls.data import lmdb_store
from hvdcls.data.datasets import check_num_classes, detect_format, open_data
from hvdcls.data.sources import holdout_split
from hvdcls.errors import UserError

CLASSES = ["ant", "bee", "cat"]


def write_images(directory: Path, label: int, count: int, salt: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        rng = np.random.default_rng([label, i, salt])
        pixels = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
        pixels[0, 0] = (label * 60, i * 40, salt)  # a marker pixel (survives PNG exactly)
        suffix = ".png" if i % 2 == 0 else ".JPG"
        Image.fromarray(pixels).save(directory / f"img{i}{suffix}",
                                     format="PNG" if suffix == ".png" else "JPEG")


def make_tree(root: Path, splits=("train", "val"), per_class=5, classes=CLASSES) -> Path:
    for salt, split in enumerate(splits):
        base = root / split if split else root
        for label, name in enumerate(classes):
            write_images(base / name, label, per_class, salt)
    return root


def load(*overrides: str) -> config.Config:
    return config.load(overrides=list(overrides))


def user_error(cfg) -> str:
    with pytest.raises(UserError) as info:
        open_data(cfg)
    assert "\n" not in str(info.value)
    return str(info.value)


def pixels(source, index) -> np.ndarray:
    image = source.image(index)
    assert image.mode == "RGB" and image.size == (12, 12)
    return np.asarray(image)


def labels(source) -> list[int]:
    return [source.label(i) for i in range(len(source))]


# --- ImageFolder --------------------------------------------------------------------------------

def test_imagefolder_with_train_and_val(tmp_path):
    root = make_tree(tmp_path / "data", per_class=5)
    data = open_data(load(f"data.path={root}"))
    assert data.name == "imagefolder"
    assert data.classes == CLASSES and data.num_classes == 3
    assert len(data.train) == 15 and len(data.val) == 15
    assert labels(data.train) == [0] * 5 + [1] * 5 + [2] * 5
    assert labels(data.val) == [0] * 5 + [1] * 5 + [2] * 5
    assert data.description["val_from"] == "val/"
    first = Image.open(root / "train" / "ant" / "img0.png").convert("RGB")
    assert np.array_equal(pixels(data.train, 0), np.asarray(first))
    assert tuple(pixels(data.val, 0)[0, 0]) == (0, 0, 1)  # salt 1: read from val/
    assert tuple(pixels(data.train, 10)[0, 0]) == (120, 0, 0)  # cat/img0.png


def test_explicit_imagefolder_name(tmp_path):
    root = make_tree(tmp_path / "data")
    assert open_data(load("data.name=imagefolder", f"data.path={root}")).name == "imagefolder"


@pytest.mark.parametrize("layout", ["train_only", "flat"])
def test_holdout_without_val(tmp_path, layout):
    root = make_tree(tmp_path / "data", splits=("train",) if layout == "train_only" else ("",))
    cfg = load(f"data.path={root}", "data.val_fraction=0.2", "training.seed=4")
    data = open_data(cfg)
    assert data.classes == CLASSES
    assert (len(data.train), len(data.val)) == (12, 3)  # round(0.2 x 15) = 3 held out
    assert data.description["val_from"] == "0.2 of train/"
    train_idx, val_idx = data.train.indices.tolist(), data.val.indices.tolist()
    assert set(train_idx).isdisjoint(val_idx) and sorted(train_idx + val_idx) == list(range(15))
    again = open_data(cfg)
    assert again.val.indices.tolist() == val_idx  # deterministic for a seed
    assert np.array_equal(pixels(data.val, 0), pixels(again.val, 0))
    others = {tuple(open_data(load(f"data.path={root}", "data.val_fraction=0.2",
                                   f"training.seed={s}")).val.indices) for s in range(5, 12)}
    assert others - {tuple(val_idx)}, "the seed must choose the hold-out"
    assert labels(data.val) == [data.train.source.label(i) for i in val_idx]


@pytest.mark.parametrize("n, fraction, n_val", [(15, 0.2, 3), (15, 0.1, 2), (1797, 0.1, 180),
                                                 (10, 0.01, 1), (2, 0.99, 1), (100, 0.5, 50)])
def test_holdout_split_sizes(n, fraction, n_val):
    train, val = holdout_split(n, fraction, seed=0)
    assert len(val) == n_val and len(train) == n - n_val
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(n))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(val) > 0)


def test_missing_path(tmp_path):
    missing = tmp_path / "nowhere"
    assert user_error(load(f"data.path={missing}")) == f"data path {missing} does not exist"
    assert user_error(load("data.name=imagefolder", f"data.path={missing}")) == (
        f"data path {missing} does not exist")


def test_empty_class_directory(tmp_path):
    root = make_tree(tmp_path / "data")
    (root / "train" / "dog").mkdir()
    (root / "train" / "dog" / "notes.txt").write_text("not an image")
    message = user_error(load(f"data.path={root}"))
    assert message.startswith(f"class directory {root / 'train' / 'dog'} has no images")


def test_root_without_class_directories(tmp_path):
    (tmp_path / "data").mkdir()
    message = user_error(load(f"data.path={tmp_path / 'data'}"))
    assert message.startswith(f"no class directories in {tmp_path / 'data'}")


def test_class_directories_differ_between_train_and_val(tmp_path):
    root = make_tree(tmp_path / "data")
    write_images(root / "train" / "dog", 3, 2, 0)
    write_images(root / "val" / "eel", 4, 2, 1)
    message = user_error(load(f"data.path={root}"))
    assert message == (f"class directories differ between {root / 'train'} and {root / 'val'}: "
                       "only in train: ['dog'], only in val: ['eel']")


def test_hidden_directories_are_not_classes(tmp_path):
    root = make_tree(tmp_path / "data", splits=("",))
    write_images(root / ".cache", 0, 1, 0)
    assert open_data(load(f"data.path={root}")).classes == CLASSES


def test_detect_format(tmp_path):
    folder = make_tree(tmp_path / "data")
    assert detect_format(folder) == "imagefolder"
    lmdb_dir = tmp_path / "lmdbdir"
    lmdb_dir.mkdir()
    (lmdb_dir / "data.mdb").write_bytes(b"")
    assert detect_format(lmdb_dir) == "lmdb"
    (tmp_path / "file.lmdb").write_bytes(b"x")
    assert detect_format(tmp_path / "file.lmdb") == "lmdb"
    with pytest.raises(UserError, match="does not exist"):
        detect_format(tmp_path / "missing")


def test_imagefolder_name_on_a_file(tmp_path):
    path = tmp_path / "file.bin"
    path.write_bytes(b"x")
    assert user_error(load("data.name=imagefolder", f"data.path={path}")) == (
        f"data path {path} is not a directory (data.name=imagefolder)")


# --- LMDB ---------------------------------------------------------------------------------------

def assert_same_split(a, b):
    assert len(a) == len(b)
    assert labels(a) == labels(b)
    for i in range(len(a)):
        assert np.array_equal(pixels(a, i), pixels(b, i)), i


def read_split(cfg, split: str):
    """(labels, pixels) of one split, from a Data object dropped before returning.

    Works around the LMDB bug below: each LMDBSource keeps its own environment open and
    py-lmdb refuses a second one on the same file in one process."""
    source = getattr(open_data(cfg), split)
    result = labels(source), [pixels(source, i) for i in range(len(source))]
    del source
    gc.collect()
    return result


def assert_same(read, source):
    got_labels, got_pixels = read
    assert got_labels == labels(source)
    assert len(got_pixels) == len(source)
    for i, image in enumerate(got_pixels):
        assert np.array_equal(image, pixels(source, i)), i


@pytest.mark.parametrize("splits", [("train", "val"), ("train",)])
@pytest.mark.parametrize("name", ["auto", "lmdb"])
def test_pack_then_open_matches_imagefolder(tmp_path, splits, name):
    root = make_tree(tmp_path / "data", splits=splits, per_class=5)
    out = tmp_path / "out.lmdb"
    meta = lmdb_store.pack(root, out, progress=False)
    assert meta["classes"] == CLASSES
    assert meta["splits"] == {split: 15 for split in splits}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out.lmdb"]  # no temp or lock
    overrides = ["data.val_fraction=0.2", "training.seed=1"]
    folder = open_data(load(f"data.path={root}", *overrides))
    cfg = load(f"data.name={name}", f"data.path={out}", *overrides)
    packed = open_data(cfg)
    assert packed.name == "lmdb" and packed.classes == folder.classes == CLASSES
    assert (len(packed.train), len(packed.val)) == (len(folder.train), len(folder.val))
    assert packed.description == {"path": str(out), "train": len(folder.train), "val": len(folder.val)}
    del packed
    assert_same(read_split(cfg, "train"), folder.train)
    assert_same(read_split(cfg, "val"), folder.val)


def test_lmdb_train_and_val_readable_in_one_process(tmp_path):
    root = make_tree(tmp_path / "data", splits=("train", "val"), per_class=2)
    lmdb_store.pack(root, tmp_path / "out.lmdb", progress=False)
    data = open_data(load(f"data.path={tmp_path / 'out.lmdb'}"))
    # py-lmdb refuses a second environment on one file in a process: both splits share one.
    assert data.train.image(0).size == data.val.image(0).size == (12, 12)


def test_lmdb_reopened_after_reading(tmp_path):
    root = make_tree(tmp_path / "data", splits=("train",), per_class=2)
    lmdb_store.pack(root, tmp_path / "out.lmdb", progress=False)
    cfg = load(f"data.path={tmp_path / 'out.lmdb'}")
    first = open_data(cfg)
    first.train.image(0)
    assert len(open_data(cfg).train) == len(first.train)


def test_pack_onto_an_existing_file(tmp_path):
    root = make_tree(tmp_path / "data")
    out = tmp_path / "out.lmdb"
    out.write_bytes(b"keep me")
    with pytest.raises(UserError) as info:
        lmdb_store.pack(root, out, progress=False)
    assert str(info.value) == f"{out} already exists: remove it or choose another name"
    assert out.read_bytes() == b"keep me"


def test_pack_a_missing_source(tmp_path):
    with pytest.raises(UserError, match="is not a directory"):
        lmdb_store.pack(tmp_path / "nope", tmp_path / "out.lmdb", progress=False)
    assert not (tmp_path / "out.lmdb").exists()


def test_pack_failure_leaves_nothing(tmp_path):
    root = make_tree(tmp_path / "data")
    (root / "train" / "dog").mkdir()  # an empty class: packing must fail before writing
    with pytest.raises(UserError, match="has no images"):
        lmdb_store.pack(root, tmp_path / "out.lmdb", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


@pytest.mark.parametrize("name", ["auto", "lmdb"])
def test_non_lmdb_file(tmp_path, name):
    path = tmp_path / "notes.lmdb"
    path.write_text("this is not an LMDB file\n" * 100)
    message = user_error(load(f"data.name={name}", f"data.path={path}"))
    assert message.startswith(f"{path} is neither an ImageFolder directory nor an LMDB file")


# --- digits and num_classes ---------------------------------------------------------------------

@pytest.mark.parametrize("fraction, n_val", [(0.1, 180), (0.2, 359)])
def test_digits(fraction, n_val):
    data = open_data(load(f"data.val_fraction={fraction}"))
    assert data.name == "digits" and data.classes == [str(d) for d in range(10)]
    assert data.num_classes == 10
    assert len(data.train) + len(data.val) == 1797
    assert len(data.val) == n_val
    assert set(labels(data.val)) == set(range(10))
    image = data.train.image(0)
    assert image.mode == "RGB" and image.size == (8, 8)
    assert open_data(load("data.name=digits")).classes == data.classes


def test_check_num_classes(tmp_path):
    root = make_tree(tmp_path / "data", splits=("train",))
    data = open_data(load(f"data.path={root}"))
    assert check_num_classes(load(f"data.path={root}"), data) == 3
    assert check_num_classes(load(f"data.path={root}", "model.num_classes=3"), data) == 3
    with pytest.raises(UserError) as info:
        check_num_classes(load(f"data.path={root}", "model.num_classes=10"), data)
    assert str(info.value) == "config model.num_classes=10 but the data has 3 classes (ant, bee, cat)"


def test_lmdb_readable_in_a_forked_worker_after_the_parent_read(tmp_path):
    """What a DataLoader worker does: fork after the parent has opened and read the file."""
    import multiprocessing

    root = make_tree(tmp_path / "data", splits=("train", "val"), per_class=2)
    lmdb_store.pack(root, tmp_path / "out.lmdb", progress=False)
    data = open_data(load(f"data.path={tmp_path / 'out.lmdb'}"))
    expected = data.train.image(1).tobytes()
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_read_train_image, (data, 1)) == expected


def _read_train_image(data, index):
    return data.train.image(index).tobytes()


def test_digits_cached_after_the_first_load(tmp_path, monkeypatch):
    """The first load writes the user's cache; a new process then reads the same pixels
    without importing scikit-learn; a damaged cache is loaded afresh and rewritten."""
    import os
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from hvdcls.data import datasets

    monkeypatch.setenv("HVDCLS_CACHE", str(tmp_path))
    images, labels = datasets.digits_arrays()
    bunch = load_digits()
    assert np.array_equal(images, np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8))
    assert np.array_equal(labels, bunch.target) and labels.dtype == np.int64
    (cached,) = tmp_path.glob("digits-sklearn-*.npz")
    probe = ("import sys, numpy as np\nfrom hvdcls.data import datasets\n"
             "images, labels = datasets.digits_arrays()\n"
             "print('sklearn' in sys.modules, int(images.astype(np.int64).sum()), int(labels.sum()))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "HVDCLS_CACHE": str(tmp_path)}).stdout.split()
    assert out == ["False", str(int(images.astype(np.int64).sum())), str(int(labels.sum()))]
    cached.write_bytes(cached.read_bytes()[:100])  # torn
    assert np.array_equal(datasets.digits_arrays()[0], images)
    assert datasets.read_digits_cache(cached) is not None  # rewritten whole
