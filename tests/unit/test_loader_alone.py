"""The loader measured alone (benchmarks/loader_alone.py): the photo set it reads
(hvdcls.bench.photos) and its arithmetic (hvdcls.bench.loader_report). Nothing here times a
pipeline."""
import math

import numpy as np
import pytest
from PIL import Image

from hvdcls.bench import loader_report, photos


def small_photos():
    rng = np.random.default_rng(0)
    return {"a": rng.integers(0, 256, (60, 80, 3), dtype=np.uint8),
            "b": rng.integers(0, 256, (90, 50, 3), dtype=np.uint8)}


def test_the_photo_set_has_the_count_the_size_and_the_format(tmp_path):
    size = photos.PhotoSize("tiny", 40, 30, portrait_share=0.5)
    root = photos.write_photo_set(tmp_path, size, 12, small_photos())
    files = sorted(root.glob("train/*/*.jpg"))
    assert root == tmp_path / "tiny" and len(files) == 12
    assert {f.parent.name for f in files} == {"a", "b"}  # one class per photograph, taking turns
    shapes = set()
    for f in files:
        with Image.open(f) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            shapes.add(image.size)
    assert shapes == {(40, 30), (30, 40)}  # landscape and, for some, portrait
    assert not list(tmp_path.glob(".tiny.tmp-*"))  # written aside, then renamed


def test_a_complete_photo_set_is_kept_and_a_short_one_remade(tmp_path):
    size = photos.PhotoSize("tiny", 32, 32)
    root = photos.write_photo_set(tmp_path, size, 4, small_photos())
    first = sorted(root.glob("train/*/*.jpg"))[0]
    stamp = first.stat().st_mtime_ns
    photos.write_photo_set(tmp_path, size, 3, small_photos())
    assert first.stat().st_mtime_ns == stamp
    photos.write_photo_set(tmp_path, size, 6, small_photos())
    assert len(list(root.glob("train/*/*.jpg"))) == 6


def test_an_upscaled_photo_gets_grain_and_a_smaller_one_none():
    flat = np.full((20, 20, 3), 128, np.uint8)
    rng = np.random.default_rng(1)
    big = np.asarray(photos.photo_jpeg(flat, 64, 48, rng), np.int16)
    assert big.shape == (48, 64, 3) and 0 < np.abs(big - 128).max() <= photos.GRAIN
    small = np.asarray(photos.photo_jpeg(flat, 16, 12, rng), np.int16)
    assert small.shape == (12, 16, 3) and np.abs(small - 128).max() == 0


def test_the_sizes_are_the_issues():
    assert {name: (s.width, s.height) for name, s in photos.SIZES.items()} == {
        "imagenet": (500, 375), "448": (448, 448), "12mp": (4000, 3000)}


def test_the_scikit_image_photographs_load_without_a_download():
    pytest.importorskip("skimage")
    found = photos.sample_photos()
    assert set(found) == set(photos.PHOTOS)
    assert all(a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3 for a in found.values())


def rep(size, transform, pipeline, images, seconds, cpu, workers=2):
    return {"size": size, "transform": transform, "pipeline": pipeline,
            **loader_report.rates(images, seconds, cpu, workers)}


def test_rates_per_worker_and_per_cpu_second():
    found = loader_report.rates(400, 2.0, 5.0, workers=2)
    assert found == {"images_per_sec": 200.0, "per_worker": 100.0, "per_cpu_second": 80.0}
    assert math.isnan(loader_report.rates(1, 1.0, 0.0, 1)["per_cpu_second"])


def test_cells_are_medians_and_targets_need_both_rates():
    reps = [rep("imagenet", "train", "hvdcls-torch", 300, 1.0, 1.0),
            rep("imagenet", "train", "hvdcls-torch", 500, 1.0, 2.0),
            rep("imagenet", "train", "hvdcls-torch", 400, 1.0, 2.0),
            rep("imagenet", "train", "torchvision", 200, 1.0, 2.0),
            rep("imagenet", "train", "hvdcls-tf", 100, 1.0, 1.0),
            rep("imagenet", "train", "tf.data", 100, 1.0, 0.5)]
    cells = loader_report.summarise(reps)
    mine = cells[("imagenet", "train", "hvdcls-torch")]
    assert mine["reps"] == 3 and mine["per_worker"] == 200.0 and mine["per_worker_range"] == [150.0, 250.0]
    assert mine["per_cpu_second"] == 250.0  # of 300, 250 and 200: each rate's own median
    assert loader_report.ratio(cells, "imagenet", "train", "hvdcls-torch", "torchvision") == 2.0
    assert loader_report.ratio(cells, "imagenet", "train", "hvdcls-torch", "torchvision", "per_cpu_second") == 2.5
    assert loader_report.ratio(cells, "12mp", "train", "hvdcls-torch", "torchvision") is None
    found = {item["target"]: item for item in loader_report.verdicts(cells)}
    assert found["imagenet train: hvdcls-torch >= 2x torchvision"]["met"] is True
    tf = found["imagenet train: hvdcls-tf >= 1x tf.data"]
    assert tf["per_worker"] == 1.0 and tf["per_cpu_second"] == 0.5 and tf["met"] is False
    assert found["12mp train: hvdcls-torch >= 5x torchvision"]["met"] is None
    lines = loader_report.verdict_lines(loader_report.verdicts(cells))
    assert "2x torchvision: met (2.00x per worker, 2.50x per cpu second)" in lines
    assert "5x torchvision: not measured" in lines


def test_the_table_has_a_row_per_size_and_transform():
    cells = loader_report.summarise([rep("448", "eval", "torchvision", 100, 1.0, 1.0, workers=1),
                                     rep("448", "eval", "hvdcls-torch", 300, 1.0, 2.0, workers=1)])
    table = loader_report.markdown(cells, ["448"], ["train", "eval"], ["hvdcls-torch", "torchvision"])
    lines = table.splitlines()
    assert lines[0] == ("| size | transform | hvdcls-torch | torchvision | hvdcls-torch / torchvision "
                        "| hvdcls-tf / tf.data |")
    assert lines[2] == "| 448 | train | - | - | - | - |"
    assert lines[3] == "| 448 | eval | 300.0 (150.0) | 100.0 (100.0) | 3.00x (1.50x) | - |"
