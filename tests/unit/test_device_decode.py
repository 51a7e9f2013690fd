"""data.decode's checks (hvdcls.data.device_decode.resolve, hvdcls.config.checks): what cannot
decode on the GPU is one line before any work, and `auto` off CUDA is the workers' path. The
decoding itself: tests/torch_backend/test_decode.py."""
import subprocess
import sys

import pytest

from hvdcls.config import load
from hvdcls.data.device_decode import resolve
from hvdcls.errors import UserError


def test_gpu_with_the_cpu_as_device_is_one_line_exit_2():
    result = subprocess.run([sys.executable, "-m", "hvdcls", "train", "data.decode=gpu", "training.device=cpu"],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "data.decode=gpu" in line and "training.device=cpu" in line


@pytest.mark.parametrize("override, named", [
    ("data.augment.policy=randaugment", "data.augment.policy=randaugment"),
    ("data.augment.random_erase=0.25", "data.augment.random_erase=0.25"),
    ("data.mixup_alpha=0.2", "data.mixup_alpha=0.2"),
    ("data.augment.preset=small", "data.augment.preset=small"),
])
def test_gpu_with_augmentation_on_the_decoded_pixels_is_refused(override, named):
    with pytest.raises(UserError, match=f"data.decode=gpu with {named}"):
        load(overrides=["data.decode=gpu", override])
    load(overrides=["data.decode=auto", override])  # auto decodes in the workers instead


def test_resolve():
    assert resolve("cpu", "cuda", None) is False
    assert resolve("auto", "cuda", None) is True
    assert resolve("auto", "cpu", None) is False and resolve("auto", "cuda", "no decoder") is False
    assert resolve("gpu", "cuda", None) is True
    with pytest.raises(UserError, match="data.decode=gpu: no decoder; data.decode=auto or cpu"):
        resolve("gpu", "cuda", "no decoder")
    with pytest.raises(UserError, match="trains on cpu"):
        resolve("gpu", "cpu", None)


def test_the_tensorflow_backend_says_why_it_cannot():
    tf_decode = pytest.importorskip("tf_backend.decode")
    with pytest.raises(UserError, match="tensorflow backend decodes JPEGs on the CPU"):
        resolve("gpu", "cuda", tf_decode.unsupported())
    assert resolve("auto", "cuda", tf_decode.unsupported()) is False
