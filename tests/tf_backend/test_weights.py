"""tf_backend.weights: model.weights from keras' imagenet weights, a Keras file or an hvdcls
run, fitted into the model built (a head of another class count replaced, a ViT's position
embedding interpolated), and the build hook of `hvdcls train` end to end.

keras' imagenet files are made here from random models of the same architecture and put in a
temporary keras cache under keras' own file names; keras checks those files' hashes, so the
tests that use them answer that check (`imagenet_cache`).

Mirror: tests/torch_backend/test_weights.py.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py
import keras
import numpy as np
import pytest

from hvdcls import config as cfg
from hvdcls import pretrained
from hvdcls.errors import UserError
from hvdcls.models import ViT
from tests.run_files import read_json
from tests.tf_backend.tf_runs import CLASSES, FILE_CLASSES, IMAGE_SIZE, trained_run, write_foreign_run
from tf_backend import models, weights
from tf_backend.vit import vision_transformer

IMAGENET_FILES = {"mobilenet_v2": "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224.h5",
                  "resnet50": "resnet50_weights_tf_dim_ordering_tf_kernels.h5",
                  "efficientnetb0": "efficientnetb0.h5"}  # keras.applications' names for them
TINY_VIT = ViT(patch_size=4, hidden=16, layers=1, heads=2, mlp=32)


def config_for(name: str, source: str, size: int = 32, *more: str) -> cfg.Config:
    return cfg.load(overrides=[f"model.name={name}", f"model.weights={source}", "data.name=synthetic",
                               f"data.image_size={size}", *more])


def load(model: keras.Model, source: str, name: str, size: int = 32) -> dict:
    return weights.load_initial_weights(model, config_for(name, source, size))


def legacy_h5(model: keras.Model, path) -> None:
    """`model`'s weights in the layout of keras.applications' files (Keras 2's .h5)."""
    from keras.src.legacy.saving import legacy_h5_format

    with h5py.File(path, "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, model)


def save_as(model: keras.Model, path) -> None:
    """Keras' file of the kind `path`'s suffix names: .keras, .weights.h5, or a legacy .h5."""
    if path.name.endswith(".keras"):
        model.save(path)
    elif path.name.endswith(".weights.h5"):
        model.save_weights(path)
    else:
        legacy_h5(model, path)


def assert_same_but_head(model: keras.Model, source: keras.Model) -> None:
    """Every variable of `model` but its head's holds `source`'s at the same position."""
    head = set(weights.head_variables(model))
    for mine, theirs in zip(model.variables, source.variables, strict=True):
        if mine.path not in head:
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)


@pytest.fixture(scope="module")
def imagenet_sources(tmp_path_factory) -> tuple:
    """A keras cache (KERAS_HOME) holding "imagenet" files of random models, and those models."""
    home = tmp_path_factory.mktemp("keras-home")
    (home / "models").mkdir()
    keras.utils.set_random_seed(1)
    sources = {"mobilenet_v2": keras.applications.MobileNetV2(weights=None, classifier_activation=None),
               "resnet50": keras.applications.ResNet50(weights=None, classifier_activation=None)}
    for name, model in sources.items():
        legacy_h5(model, home / "models" / IMAGENET_FILES[name])
    return home, sources


@pytest.fixture
def imagenet_cache(imagenet_sources, monkeypatch) -> tuple:
    """keras' cache pointed at the files made here (keras reads KERAS_HOME once, when imported),
    its hash check answered yes for them. Returns the cache's models/ folder and the sources."""
    from keras.src.backend import config as keras_config
    from keras.src.utils import file_utils

    home, sources = imagenet_sources
    monkeypatch.setattr(keras_config, "_KERAS_DIR", str(home))
    monkeypatch.setattr(file_utils, "validate_file", lambda *args, **kwargs: True)
    return home / "models", sources


def test_imagenet_reads_keras_cache_and_replaces_the_head(imagenet_cache):
    model = models.build_model("mobilenet_v2", CLASSES, 32)
    report = load(model, "imagenet", "mobilenet_v2")
    assert report == {"source": "the framework's pretrained 'imagenet'",
                      "replaced": [f"predictions: 1000 -> {CLASSES} classes"], "interpolated": []}
    assert_same_but_head(model, imagenet_cache[1]["mobilenet_v2"])
    assert tuple(model.layers[-1].kernel.shape) == (1280, CLASSES)


def test_caffe_weights_take_rgb_as_keras_preprocess_input_gives_bgr(imagenet_cache):
    """ResNet50's caffe weights in a model fed RGB normalised as hvdcls does (the mean and std
    the weights bring) give the logits keras' own model gives on preprocess_input's BGR."""
    model = models.build_model("resnet50", 1000, 32)
    assert load(model, "imagenet", "resnet50")["replaced"] == []
    cache, _ = imagenet_cache  # keras' own model at 32 px: its loader given the file itself
    keras_own = keras.applications.ResNet50(weights=str(cache / IMAGENET_FILES["resnet50"]),
                                            input_shape=(32, 32, 3), classifier_activation=None)
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)  # RGB
    expected = keras_own(keras.applications.resnet50.preprocess_input(pixels.copy()), training=False).numpy()
    convention = pretrained.keras_preprocessing("resnet50")
    assert convention.bgr
    normalised = (pixels / 255 - np.float32(convention.mean)) / np.float32(convention.std)
    logits = model(normalised, training=False).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    flipped_back = model(normalised[..., ::-1], training=False).numpy()  # the flip is what matters
    assert np.abs(flipped_back - expected).max() > 1e-2 * np.abs(expected).max()


def test_efficientnet_takes_raw_pixels_as_keras_own_imagenet_model(imagenet_cache):
    """EfficientNet's file holds its std as a variance; keras corrects it with a layer of its
    own when it loads the file itself: hvdcls's model gives the logits keras' does."""
    cache, _ = imagenet_cache
    keras.utils.set_random_seed(2)
    source = keras.applications.EfficientNetB0(weights=None, classifier_activation=None)
    stem = next(layer for layer in source.layers if isinstance(layer, keras.layers.Normalization))
    stem.adapt_mean.assign([0.485, 0.456, 0.406])
    stem.adapt_variance.assign(pretrained.IMAGENET_STD)  # what keras' file holds there
    legacy_h5(source, cache / IMAGENET_FILES["efficientnetb0"])
    config = config_for("efficientnetb0", "imagenet", 224)
    assert models.raw_pixels(config.data.mean, config.data.std)  # the weights' preprocessing: raw pixels
    model = models.build_model("efficientnetb0", 1000, 224, raw=True)
    weights.load_initial_weights(model, config)
    keras_own = keras.applications.EfficientNetB0(weights="imagenet", classifier_activation=None)
    pixels = np.random.default_rng(1).uniform(0, 255, (2, 224, 224, 3)).astype(np.float32)
    expected = keras_own(pixels, training=False).numpy()
    np.testing.assert_allclose(model(pixels, training=False).numpy(), expected,
                               rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_imagenet_for_a_model_keras_has_none_of_is_one_line():
    with pytest.raises(UserError, match="keras.applications has no weights for compact_cnn"):
        load(models.compact_cnn(CLASSES, 16), "imagenet", "compact_cnn", 16)
    with pytest.raises(UserError, match="tensorflow backend's pretrained weights are keras.applications' 'imagenet'"):
        load(models.compact_cnn(CLASSES, 16), "DEFAULT", "compact_cnn", 16)


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras", ".h5"])
def test_keras_files_load_and_another_class_count_replaces_the_head(tmp_path, suffix):
    keras.utils.set_random_seed(3)
    source = models.compact_cnn(FILE_CLASSES, 16)
    path = tmp_path / f"cnn{suffix}"
    save_as(source, path)
    model = models.compact_cnn(CLASSES, 16)
    report = load(model, str(path), "compact_cnn", 16)
    head = model.layers[-1].name
    assert report == {"source": f"the file {path}", "replaced": [f"{head}: {FILE_CLASSES} -> {CLASSES} classes"],
                      "interpolated": []}
    assert_same_but_head(model, source)
    same = models.compact_cnn(FILE_CLASSES, 16)  # the same class count: nothing replaced
    assert load(same, str(path), "compact_cnn", 16)["replaced"] == []
    np.testing.assert_array_equal(same.layers[-1].kernel.numpy(), source.layers[-1].kernel.numpy())


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_a_file_of_another_architecture_is_one_line_naming_the_variable(tmp_path, suffix):
    source = keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3), classes=CLASSES)
    path = tmp_path / f"other{suffix}"
    save_as(source, path)
    with pytest.raises(UserError) as err:
        load(models.build_model("mobilenet_v2", CLASSES, 32), str(path), "mobilenet_v2")
    line = str(err.value)
    assert line.startswith(f"model.weights={path} does not fit mobilenet_v2: ") and "\n" not in line
    assert " there, (" in line and " in the model" in line  # a variable's path and both shapes


def test_an_unreadable_file_is_one_line(tmp_path):
    for name in ("broken.weights.h5", "broken.keras"):
        (tmp_path / name).write_bytes(b"not a keras file")
        with pytest.raises(UserError, match=f"model.weights={tmp_path / name} does not fit compact_cnn: "):
            load(models.compact_cnn(CLASSES, 16), str(tmp_path / name), "compact_cnn", 16)


def test_a_vits_position_embedding_of_another_grid_is_interpolated(tmp_path):
    """A ViT saved at 32 px (8x8 patches of 4) into one at 16 px (4x4): positions resampled."""
    keras.utils.set_random_seed(4)
    source = vision_transformer(TINY_VIT, CLASSES, 32)
    source.save(tmp_path / "vit.keras")
    model = vision_transformer(TINY_VIT, CLASSES, 16)
    report = load(model, str(tmp_path / "vit.keras"), "vit_b_16", 16)
    assert report["interpolated"] == ["positions: 8x8 -> 4x4 patches"] and report["replaced"] == []
    tokens = model.get_layer("tokens")
    expected = weights.interpolate_positions(source.get_layer("tokens").positions.numpy(), 4)
    np.testing.assert_array_equal(tokens.positions.numpy(), expected)
    np.testing.assert_array_equal(model.get_layer("conv_proj").kernel.numpy(),
                                  source.get_layer("conv_proj").kernel.numpy())


def test_interpolating_positions_keeps_the_class_token_a_constant_grid_and_the_same_grid():
    embedding = np.concatenate([np.full((1, 1, 8), 7.0), np.full((1, 16, 8), 0.25)], axis=1).astype(np.float32)
    smaller = weights.interpolate_positions(embedding, 3)
    assert smaller.shape == (1, 10, 8)
    np.testing.assert_allclose(smaller[:, 1:], 0.25, atol=1e-6)
    assert (smaller[:, 0] == 7.0).all()
    varied = np.random.default_rng(0).standard_normal((1, 17, 8)).astype(np.float32)
    np.testing.assert_allclose(weights.interpolate_positions(varied, 4), varied, atol=1e-5)
    assert weights.grid_side((1, 10, 8), 8) == 3 and weights.grid_side((1, 11, 8), 8) == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return trained_run(tmp_path_factory)


def test_hvdcls_train_starts_from_a_file_and_says_so(run):
    """The build hook end to end: the run started from a compact_cnn file of 10 classes."""
    replaced = f"dense: {FILE_CLASSES} -> {CLASSES} classes"
    assert f"weights: the file {run.start_file} (head replaced: {replaced})" in run.stdout
    info = read_json(run.run_dir / "summary.json")["model_info"]["weights"]
    assert info == {"source": f"the file {run.start_file}", "replaced": [replaced], "interpolated": []}


def checkpoint_arrays(run) -> dict:
    with np.load(run.run_dir / "checkpoints" / "epoch-0001" / weights.CHECKPOINT_FILE) as stored:
        return {key: stored[key] for key in stored.files}


@pytest.mark.parametrize("card_weights", ["ema", "model"])
def test_a_run_gives_its_ema_or_its_model(run, card_weights, tmp_path):
    """The run's card says EMA: its ema/<j> arrays fill the floating variables; a card that
    says model: model/<i> as they are. A checkpoint directory names the run too."""
    card = read_json(run.run_dir / "model_card.json")
    assert card["weights"] == "ema"
    source = run.run_dir if card_weights == "ema" else copy_with_card(run.run_dir, tmp_path, weights="model")
    model = models.compact_cnn(CLASSES, IMAGE_SIZE)
    assert load(model, str(source), "compact_cnn", IMAGE_SIZE)["replaced"] == []
    stored, floating = checkpoint_arrays(run), 0
    for i, variable in enumerate(model.variables):
        expected = stored[f"model/{i}"]
        if card_weights == "ema" and expected.dtype.kind == "f":
            expected, floating = stored[f"ema/{floating}"], floating + 1
        np.testing.assert_array_equal(variable.numpy(), expected, err_msg=variable.path)
    assert card_weights == "model" or floating == len([k for k in stored if k.startswith("ema/")])
    if card_weights == "ema":  # the EMA is not the model
        assert any(not np.array_equal(stored[f"ema/{j}"], stored[f"model/{j}"]) for j in range(4))
    load(models.compact_cnn(CLASSES, IMAGE_SIZE), str(source / "checkpoints" / "epoch-0001"), "compact_cnn",
         IMAGE_SIZE)


def copy_with_card(run_dir, tmp_path, **changes):
    import json
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    card = {**json.loads((copy / "model_card.json").read_text()), **changes}
    (copy / "model_card.json").write_text(json.dumps(card))
    return copy


def test_a_run_of_another_model_is_one_line_naming_the_variable(run):
    with pytest.raises(UserError) as err:
        load(models.build_model("mobilenet_v2", CLASSES, 32), str(run.run_dir), "mobilenet_v2")
    assert str(err.value).startswith(f"model.weights={run.run_dir} does not fit mobilenet_v2: ")
    assert " there, (" in str(err.value) and "\n" not in str(err.value)


def test_a_torch_run_is_one_line(tmp_path):
    run_dir = write_foreign_run(tmp_path / "torch-run", "torch")
    with pytest.raises(UserError) as err:
        load(models.compact_cnn(CLASSES, IMAGE_SIZE), str(run_dir), "compact_cnn", IMAGE_SIZE)
    assert str(err.value).startswith(f"{run_dir} was trained by the torch backend; ")
    assert "\n" not in str(err.value)


def test_rank_0s_error_is_raised_on_every_rank_and_its_report_shared(tmp_path):
    """load_initial_weights with the backend's broadcast standing in: rank 1 reads nothing."""
    bad = tmp_path / "bad.weights.h5"
    bad.write_bytes(b"nothing")
    config = config_for("compact_cnn", str(bad), 16)
    sent = []

    def share(outcome, name):
        sent.append(outcome)
        return outcome

    with pytest.raises(UserError, match="does not fit compact_cnn"):
        weights.load_initial_weights(models.compact_cnn(CLASSES, 16), config, 0, share)
    assert sent[0][0] == "error"
    with pytest.raises(UserError, match="does not fit compact_cnn"):  # rank 1 gets rank 0's outcome
        weights.load_initial_weights(models.compact_cnn(CLASSES, 16), config, 1, lambda _, name: sent[0])
    fine = {"source": "the file x", "replaced": [], "interpolated": []}
    assert weights.load_initial_weights(models.compact_cnn(CLASSES, 16), config, 1, lambda _, n: ("ok", fine)) == fine
