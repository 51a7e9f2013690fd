"""hvdcls.bench.data's files on disk and its endless batches; hvdcls.launching.gpu's answer without a GPU."""
import os
import subprocess
import sys

from PIL import Image

from hvdcls.bench import data as bench_data
from hvdcls.data import lmdb_store
from hvdcls.data.sharding import TrainShards
from hvdcls.launching import gpu


def test_the_data_set_is_readable_jpegs_and_an_lmdb_of_them(tmp_path):
    paths = bench_data.write_dataset(tmp_path, 40, 24, ["lmdb"])
    files = sorted(paths.imagefolder.glob("train/*/*.jpg"))
    assert len(files) == 40 and len({f.parent.name for f in files}) == bench_data.NUM_CLASSES
    with Image.open(files[0]) as image:
        assert image.format == "JPEG" and image.size == (48, 48)  # twice the image size: crops work
    meta = lmdb_store.read_meta(paths.lmdb)
    assert meta["splits"] == {"train": 40} and len(meta["classes"]) == bench_data.NUM_CLASSES
    assert not list(tmp_path.glob("data/.*"))  # no temporary names left behind


def test_memory_cells_write_nothing(tmp_path):
    bench_data.write_dataset(tmp_path, 40, 24, ["memory"])
    assert not (tmp_path / "data").exists()


def test_enough_images_but_not_too_many():
    assert bench_data.images_needed([1, 2], [4], 3) == bench_data.MIN_IMAGES
    assert bench_data.images_needed([2], [64], 40) == bench_data.MAX_IMAGES
    assert bench_data.images_needed([4], [256], 1) == 1024  # one step of the largest cell


class ListLoader:
    """A backend whose loader hands back the batches' sample indices and epoch."""

    def loader(self, batches, workers):
        return [(batches.epoch, list(b)) for b in batches.batches]


def test_batches_go_on_into_a_new_epoch():
    shards = TrainShards(8, world_size=2, rank=1, batch_size=2)
    stream = bench_data.endless_batches(ListLoader(), None, shards, None, 0)
    seen = [next(stream) for _ in range(5)]
    assert [epoch for epoch, _ in seen] == [0, 0, 1, 1, 2]
    assert sorted(i for _, b in seen[:2] for i in b) == sorted(shards.indices(0).tolist())


def fake_nvidia_smi(folder, output: str, status: int = 0):
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {status}\n")
    tool.chmod(0o755)


def test_gpus_are_what_nvidia_smi_lists(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu.nvidia_gpus() == []  # no tool
    fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed\\n", 9)
    assert gpu.nvidia_gpus() == []
    fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-1)\\n")
    assert gpu.nvidia_gpus() == ["GPU 0: NVIDIA H200 (UUID: GPU-1)"]


def test_bench_on_cuda_without_a_gpu_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no nvidia-smi, whatever this machine has
    result = subprocess.run([sys.executable, "-m", "hvdcls", "bench", "--device", "cuda",
                             "--no-baselines", "--output-dir", str(tmp_path / "out"), "--quiet"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "hvdcls: error: --device cuda needs an NVIDIA GPU and this machine has none "
        "(no nvidia-smi, or it lists no GPU)"]
    assert not (tmp_path / "out").exists()  # nothing launched, nothing written
