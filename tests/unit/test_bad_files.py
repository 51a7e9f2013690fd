"""hvdcls.data.bad_files: unreadable, truncated and non-image files under data.bad_files=skip|fail,
read the way training reads them (EpochBatches), from ImageFolder directories and LMDB files."""
import io
import multiprocessing

import numpy as np
import pytest
from PIL import Image

from hvdcls import config
from hvdcls.data import datasets, lmdb_store
from hvdcls.data.bad_files import BadFileLog, summarise
from hvdcls.data.batches import EpochBatches
from hvdcls.data.transforms import Preprocess
from hvdcls.errors import UserError

PER_CLASS = 4


def png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(out, "PNG")
    return out.getvalue()


BROKEN = {"truncated.png": png(7)[:40], "not-an-image.jpg": b"just some text\n", "empty.png": b""}


def write_tree(root, broken=BROKEN):
    """train/ and val/ with classes a and b; the broken files sit in train/b."""
    for split in ("train", "val"):
        for label, name in enumerate("ab"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(PER_CLASS):
                (folder / f"{i}.png").write_bytes(png(100 * label + i))
    for name, content in broken.items():
        (root / "train" / "b" / name).write_bytes(content)
    return root


def load(path, policy):
    return config.load(overrides=[f"data.path={path}", f"data.bad_files={policy}", "data.image_size=8",
                                  "data.augment.random_resized_crop=false", "data.augment.hflip=0",
                                  "data.mean=[0,0,0]", "data.std=[1,1,1]"])


def read_all(data, cfg):
    """Every train sample once, as training reads them: (pixels, labels)."""
    batches = EpochBatches(data.train, [np.arange(len(data.train))], Preprocess(cfg.data), 0, train=True)
    return batches[0]


@pytest.fixture(params=["imagefolder", "lmdb"])
def data_path(request, tmp_path):
    root = write_tree(tmp_path / "tree")
    if request.param == "imagefolder":
        return root
    lmdb_store.pack(root, tmp_path / "data.lmdb", progress=False)
    return tmp_path / "data.lmdb"


def test_skip_keeps_every_batch_full_warns_once_and_counts(data_path, capsys):
    cfg = load(data_path, "skip")
    data = datasets.open_data(cfg)
    assert len(data.train) == 2 * PER_CLASS + len(BROKEN)
    for _ in range(2):  # a second epoch meets the same files: no second warning
        pixels, labels = read_all(data, cfg)
        assert pixels.shape[0] == len(labels) == len(data.train)
    # Every sample read, the substitutes included, is a real one with its own label.
    grey = np.round(pixels[:, 0, 0, 0] * 255).astype(int)
    assert all(value // 100 == label for value, label in zip(grey, labels))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "skipping" in line]
    assert len(warnings) == len(BROKEN) == len(data.bad_files.skipped())
    assert all(line.startswith("hvdcls: warning: skipping unreadable image ") for line in warnings)
    assert all(any(named(name, data_path) in line for line in warnings) for name in BROKEN)
    assert data.bad_files.fatal() is None


def named(name, data_path):
    """How a warning names a broken file: its path, or in an LMDB file its record."""
    if data_path.is_dir():
        return name
    return f"{data_path}:train/{2 * PER_CLASS + sorted(BROKEN).index(name)}"  # after a/ and b/N.png


def test_fail_names_the_file_in_one_line(data_path):
    cfg = load(data_path, "fail")
    data = datasets.open_data(cfg)
    with pytest.raises(UserError) as caught:
        read_all(data, cfg)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("cannot read image ")
    assert any(named(name, data_path) in message for name in BROKEN)
    assert "data.bad_files=fail" in message
    assert data.bad_files.fatal() == message  # what train.py reports when a worker raised it


def test_clean_data_skips_nothing(tmp_path):
    cfg = load(write_tree(tmp_path / "tree", broken={}), "skip")
    data = datasets.open_data(cfg)
    read_all(data, cfg)
    assert data.bad_files.skipped() == []


def test_all_files_unreadable_is_one_line(tmp_path):
    root = write_tree(tmp_path / "tree", broken={})
    for path in (root / "train").rglob("*.png"):
        path.write_bytes(b"broken")
    cfg = load(root, "skip")
    with pytest.raises(UserError, match="no image of this split can be read"):
        read_all(datasets.open_data(cfg), cfg)


def _read_bad_sample(data, index, queue):
    try:
        data.train.image(index)
        queue.put("ok")
    except Exception as err:  # reported to the parent, which asserts on it
        queue.put(repr(err))


def test_a_forked_loader_worker_records_into_the_ranks_log(tmp_path):
    """What a torch DataLoader worker meets is counted by its rank (the log is a directory)."""
    cfg = load(write_tree(tmp_path / "tree"), "skip")
    data = datasets.open_data(cfg)
    bad = next(i for i in range(len(data.train)) if data.train.inner.paths[i].name in BROKEN)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    worker = context.Process(target=_read_bad_sample, args=(data, bad, queue))
    worker.start()
    assert queue.get(timeout=60) == "ok"
    worker.join(60)
    # Its search for a substitute walked over the three adjacent broken files of train/b.
    assert data.bad_files.skipped() == sorted(str(data_path) for data_path in
                                              (tmp_path / "tree" / "train" / "b" / n for n in BROKEN))


def test_summary_is_the_union_over_ranks():
    assert summarise("skip", [["b", "a"], ["a"], []]) == {"policy": "skip", "skipped": 2, "files": ["a", "b"]}
    assert summarise("fail", [[]]) == {"policy": "fail", "skipped": 0, "files": []}
    assert summarise("skip", [[str(i) for i in range(150)]])["files"] == sorted(map(str, range(150)))[:100]


def test_log_directory_is_removed(tmp_path):
    log = BadFileLog("skip", tmp_path / "log")
    log.directory.mkdir()
    log.remove()
    assert not log.directory.exists() and log.skipped() == []
