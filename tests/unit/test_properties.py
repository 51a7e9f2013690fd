"""Property-based tests (hypothesis): random config values and random file contents thrown at
the config loader and the data loaders. A user's mistake must come back as one UserError line,
never as a traceback, and reading must end (pytest-timeout bounds a hang)."""
import io
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image

from hvdcls import config
from hvdcls.data import datasets
from hvdcls.data.batches import EpochBatches
from hvdcls.data.transforms import Preprocess
from hvdcls.errors import UserError

KEYS = sorted(f"{section}.{key}" for section, values in config.to_dict(config.Config()).items()
              for key in values if not isinstance(values[key], dict))
SCALARS = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.none(), st.text(string.printable, max_size=12))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4)).map(repr)
TEXT_VALUES = st.text(string.printable.replace("\n", "").replace("\r", ""), max_size=16)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_line_or_config(load):
    try:
        return load()
    except UserError as err:
        assert str(err) and "\n" not in str(err), repr(str(err))
        return None


@pytest.mark.timeout(120)
@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(VALUES, TEXT_VALUES)), min_size=1, max_size=4))
def test_random_overrides_give_a_config_or_one_line(pairs):
    one_line_or_config(lambda: config.load(overrides=[f"{key}={value}" for key, value in pairs]))


@pytest.mark.timeout(120)
@SETTINGS
@given(st.text(string.printable, max_size=200))
def test_random_yaml_files_give_a_config_or_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_text(text)
    one_line_or_config(lambda: config.load(config_file=path))


def png(seed: int) -> bytes:
    out = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


GOOD = png(0)
CONTENTS = st.one_of(st.binary(max_size=300), st.just(GOOD), st.integers(1, len(GOOD) - 1).map(lambda n: GOOD[:n]),
                     st.binary(min_size=1, max_size=50).map(lambda junk: GOOD[:40] + junk))


@pytest.mark.timeout(300)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(CONTENTS, min_size=2, max_size=6), st.sampled_from(["skip", "fail"]))
def test_random_file_contents_are_read_or_refused_in_one_line(tmp_path_factory, contents, policy):
    root = tmp_path_factory.mktemp("tree")
    for i, content in enumerate(contents):  # two classes, the files spread over both
        folder = root / f"class{i % 2}"
        folder.mkdir(exist_ok=True)
        (folder / f"{i}.png").write_bytes(content)
    cfg = one_line_or_config(lambda: config.load(overrides=[f"data.path={root}", f"data.bad_files={policy}",
                                                            "data.image_size=8", "data.val_fraction=0.5"]))
    data = one_line_or_config(lambda: datasets.open_data(cfg))
    if data is None:
        return
    batches = EpochBatches(data.train, [np.arange(len(data.train))], Preprocess(cfg.data), 0, train=True)
    read = one_line_or_config(lambda: batches[0])
    if read is not None:  # a batch, always full: every slot holds a decodable image
        assert read[0].shape == (len(data.train), 8, 8, 3) and np.isfinite(read[0]).all()
    data.bad_files.remove()
