"""A user's own images: an ImageFolder directory of real PNG files, and the same directory
packed into LMDB with `hvdcls data pack`, trained by both backends under horovodrun -np 2
with parallel loader workers. The format must not change a single number."""
import subprocess
import sys

import pytest

from tests.image_tree import write_digits_imagefolder
from tests.parallel.test_train import NP, train
from tests.run_files import read_json, read_metrics

pytestmark = pytest.mark.parallel


@pytest.fixture(scope="module")
def image_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("images")
    folder = write_digits_imagefolder(base / "digits")
    packed = base / "digits.lmdb"
    result = subprocess.run([sys.executable, "-m", "hvdcls", "data", "pack", str(folder), "-o", str(packed)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1437 train, 360 val images, 10 classes" in result.stdout
    return folder, packed


def train_on(backend: str, data, out) -> dict:
    train("horovodrun", NP, backend, out, "--data", str(data), "--epochs", "3", "--workers", "2",
          "output.checkpoint_every=0")
    return read_json(out / "summary.json")


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_imagefolder_and_lmdb_train_alike(backend, image_dirs, tmp_path):
    folder, packed = image_dirs
    from_folder = train_on(backend, folder, tmp_path / "folder")
    from_lmdb = train_on(backend, packed, tmp_path / "lmdb")
    assert (from_folder["dataset"], from_lmdb["dataset"]) == ("imagefolder", "lmdb")
    assert from_folder["data"]["val_from"] == "val/"
    assert from_folder["val_accuracy"] >= 0.8, from_folder["val_accuracy"]
    assert len(set(from_folder["rank_weight_digests"])) == 1
    # Same bytes, same sharding, same augmentation draws: the same run, number for number.
    assert from_lmdb["rank_weight_digests"] == from_folder["rank_weight_digests"]
    for a, b in zip(read_metrics(tmp_path / "folder"), read_metrics(tmp_path / "lmdb")):
        assert (a["train_loss"], a["val_accuracy"]) == (b["train_loss"], b["val_accuracy"])
