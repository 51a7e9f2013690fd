"""hvdcls.data.presets and the presets in Preprocess: auto picks by the measured native size, the
digits keep their augmentation draw for draw, bad values are one line."""
import numpy as np
import pytest
from PIL import Image

from hvdcls import config
from hvdcls.config import AugmentConfig, DataConfig
from hvdcls.data import presets
from hvdcls.data.bad_files import UnreadableImage
from hvdcls.data.datasets import open_data
from hvdcls.data.sources import ArraySource
from hvdcls.data.transforms import Preprocess, random_resized_crop_box, sample_rng
from hvdcls.errors import UserError
from tests.unit.test_cli import run_cli


def source(side: int, count: int = 40, height=None) -> ArraySource:
    images = np.random.default_rng(0).integers(0, 256, (count, height or side, side, 3), dtype=np.uint8)
    return ArraySource(images, np.arange(count) % 2)


@pytest.mark.parametrize("size, preset", [(8, "small"), (32, "small"), (63, "small"), (64, "imagenet"),
                                          (500, "imagenet"), (None, "imagenet")])
def test_preset_for_size(size, preset):
    assert presets.preset_for_size(size) == preset


def test_auto_measures_the_shorter_side_and_reports_why():
    choice = presets.choose(DataConfig(), "imagefolder", source(32, height=48), seed=0)
    assert choice.describe() == {"preset": "small", "chosen_by": "auto: native 32 px < 64", "native_size": 32}
    large = presets.choose(DataConfig(), "lmdb", source(96), seed=0)
    assert (large.preset, large.native_size, large.reason) == ("imagenet", 96, "auto: native 96 px >= 64")


def test_configured_preset_and_known_formats_are_not_measured():
    class Unopenable(ArraySource):
        def image(self, index):
            raise AssertionError("opened")

    never = Unopenable(np.zeros((3, 8, 8), np.uint8), np.zeros(3, np.int64))
    assert presets.choose(DataConfig(augment=AugmentConfig(preset="none")), "imagefolder", never, 0).reason == "config"
    assert presets.choose(DataConfig(), "synthetic", never, 0).preset == "imagenet"


def test_native_size_passes_over_unreadable_files():
    class HalfBroken(ArraySource):
        def image(self, index):
            if index % 2:
                raise UnreadableImage(f"f{index}", "truncated")
            return super().image(index)

    broken = HalfBroken(np.zeros((10, 20, 30, 3), np.uint8), np.zeros(10, np.int64))
    assert presets.native_size(broken, seed=0) == 20


def test_open_data_on_a_small_imagefolder_picks_small(tmp_path):
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(5):
            Image.new("RGB", (28, 28), (i * 40, 0, 0)).save(tmp_path / label / f"{i}.png")
    data = open_data(config.load(overrides=[f"data.path={tmp_path}"]))
    assert data.augment["preset"] == "small" and data.augment["native_size"] == 28


@pytest.mark.parametrize("preset, hflip, expected", [("imagenet", None, 0.5), ("small", None, 0.0),
                                                     ("none", None, 0.0), ("small", 0.3, 0.3)])
def test_hflip_follows_the_preset_unless_set(preset, hflip, expected):
    assert presets.hflip_probability(DataConfig(augment=AugmentConfig(hflip=hflip)), preset) == expected


def test_small_and_none_presets():
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    data = DataConfig(image_size=32, mean=[0, 0, 0], std=[1, 1, 1])
    none = Preprocess(data, 0, "none")
    assert np.array_equal(none.train(img, 0, 5), np.asarray(img, np.float32) / 255)
    small = Preprocess(data, 0, "small")
    outs = [small.train(img, 0, i) for i in range(20)]
    assert all(o.shape == (32, 32, 3) for o in outs)
    assert len({o.tobytes() for o in outs}) == 20 and np.array_equal(outs[3], small.train(img, 0, 3))
    # pad-and-crop by up to 4 px: black borders of at most 4 px, never more
    for out in outs:
        blank_rows = [r for r in range(32) if not out[r].any()]
        assert all(r < 4 or r >= 28 for r in blank_rows)


def test_digits_augmentation_is_draw_for_draw_what_it_was():
    """The old Preprocess.train: crop box, resize, one draw for the flip (never taken)."""
    cfg = config.load()
    img = Image.fromarray(np.random.default_rng(2).integers(0, 256, (8, 8, 3), dtype=np.uint8))
    assert cfg.data.augment.preset == "imagenet"  # so open_data's choice is "config"
    prep = Preprocess(cfg.data, cfg.training.seed, "imagenet")
    for index in range(10):
        rng = sample_rng(cfg.training.seed, 1, index)
        box = random_resized_crop_box(8, 8, cfg.data.augment.scale, cfg.data.augment.ratio, rng)
        old = img.resize((16, 16), Image.BILINEAR, box=box)
        assert rng.random() >= 0.0  # the flip's draw
        expected = (np.asarray(old, np.float32) / 255 - 0.5) / 0.5
        assert np.array_equal(prep.train(img, 1, index), expected)


@pytest.mark.parametrize("override, key", [
    ("data.augment.preset=tiny", "data.augment.preset"), ("data.augment.policy=randaug", "data.augment.policy"),
    ("data.mixup_alpha=-0.2", "data.mixup_alpha"), ("data.cutmix_alpha=-1", "data.cutmix_alpha"),
    ("data.mix_switch_prob=1.5", "data.mix_switch_prob"), ("data.augment.magnitude=31", "data.augment.magnitude"),
    ("data.augment.random_erase=2", "data.augment.random_erase"), ("data.augment.num_ops=0", "data.augment.num_ops")])
def test_bad_values_are_one_line_naming_the_key(override, key):
    with pytest.raises(UserError) as info:
        config.load(overrides=[override])
    assert key in str(info.value) and "\n" not in str(info.value)


def test_bad_value_exits_2_from_the_cli():
    result = run_cli("train", "data.mixup_alpha=-1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "data.mixup_alpha" in result.stderr
