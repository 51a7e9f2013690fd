"""Broken files in a user's ImageFolder under horovodrun -np 2, with parallel loader workers
(torch DataLoader processes, tf.data threads): data.bad_files=skip trains through them and
counts them in summary.json; data.bad_files=fail stops the job with one line naming a file.

The train split holds 1,439 files (1,437 digits + 2 broken), which 2 ranks cannot split evenly:
sharding must still give every rank the same steps, or the job would stall.
"""
import subprocess

import pytest

from hvdcls.launching import launch
from tests.image_tree import write_digits_imagefolder
from tests.parallel.test_train import DIGITS, NP, train
from tests.run_files import read_json

pytestmark = pytest.mark.parallel
BROKEN = {"train/3/broken-truncated.png": "truncated", "train/7/broken-text.png": "text",
          "val/5/broken-empty.png": "empty"}
COMMON = ["--epochs", "2", "--workers", "2", "output.checkpoint_every=0", "schedule.warmup_epochs=0"]


@pytest.fixture(scope="module")
def broken_tree(tmp_path_factory):
    root = write_digits_imagefolder(tmp_path_factory.mktemp("images") / "digits")
    good = next((root / "train" / "3").iterdir()).read_bytes()
    contents = {"truncated": good[: len(good) // 2], "text": b"not an image\n", "empty": b""}
    for name, kind in BROKEN.items():
        (root / name).write_bytes(contents[kind])
    return root


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_skip_trains_through_broken_files_and_counts_them(backend, broken_tree, tmp_path):
    out = tmp_path / "run"
    result = train("horovodrun", NP, backend, out, "--data", str(broken_tree), *COMMON,
                   "data.bad_files=skip")
    summary = read_json(out / "summary.json")
    assert summary["bad_files"] == {"policy": "skip", "skipped": len(BROKEN),
                                    "files": sorted(str(broken_tree / name) for name in BROKEN)}
    assert summary["data"]["train"] == 1439 and summary["data"]["val"] == 361
    assert len(set(summary["rank_weight_digests"])) == 1
    assert summary["val_accuracy"] > 0.5, summary["val_accuracy"]
    output = result.stdout + result.stderr
    for name in BROKEN:  # once per rank that met it, at most: no storm of repeats
        warned = [line for line in output.splitlines() if f"skipping unreadable image {broken_tree / name}" in line]
        assert 1 <= len(warned) <= NP, (name, warned)


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_fail_stops_the_job_with_one_line_naming_the_file(backend, broken_tree, tmp_path):
    command = launch.hvdcls_command("train", "--backend", backend, "--config", DIGITS, "--data",
                                    str(broken_tree), "--output-dir", str(tmp_path / "run"), *COMMON)
    cmd, env = launch.local_job("horovodrun", NP, command)
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    errors = [line for line in output.splitlines() if "hvdcls: error: cannot read image " in line]
    assert errors, output[-3000:]
    assert all(any(str(broken_tree / name) in line for name in BROKEN) for line in errors), errors
    assert all(line.endswith("(data.bad_files=fail; data.bad_files=skip leaves such files out)")
               for line in errors), errors
    assert not (tmp_path / "run" / "summary.json").exists()
