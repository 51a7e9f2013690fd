"""tf_backend.inference: a run loaded for evaluation gives the logits training's validation
saw, and each export format is written, carries the card and is checked against the model.

The session's one real run (tests/tf_backend/tf_runs.py: compact_cnn, one epoch on synthetic
data, with an EMA) for the loading and the exports.

Mirror: tests/torch_backend/test_inference.py.
"""
import json
import os
import shutil
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest

from hvdcls.data import datasets
from hvdcls.errors import UserError
from hvdcls.inference.contract import EXPORT_TOLERANCE
from hvdcls.inference.run import open_run
from tests.run_files import read_metrics, val_epoch
from tests.tf_backend.tf_runs import CLASSES, IMAGE_SIZE, trained_run
from tf_backend import inference


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return trained_run(tmp_path_factory).run_dir


@pytest.fixture(scope="module")
def loaded(run_dir):
    return inference.load(open_run(run_dir), "cpu")


@pytest.fixture(scope="module")
def sample(loaded) -> np.ndarray:
    side = loaded.card.image_size
    return np.random.default_rng(0).standard_normal((5, side, side, 3)).astype(np.float32)


def cross_entropy_sum(logits: np.ndarray, labels: np.ndarray) -> float:
    shifted = logits.astype(np.float64) - logits.max(1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return float(-log_probs[np.arange(len(labels)), labels].sum())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_gives_the_logits_its_validation_saw(run_dir, loaded, workers):
    """The card says EMA, so the EMA's validation loss and accuracy are matched exactly, read
    in this thread or by tf.data's workers."""
    run = open_run(run_dir)
    assert loaded.card.weights == "ema" and loaded.card.num_classes == CLASSES
    loss, correct, count = 0.0, 0, 0
    for logits, labels in loaded.batches(val_epoch(run), workers=workers):
        assert logits.dtype == np.float32 and logits.shape == (len(labels), CLASSES)
        loss += cross_entropy_sum(logits, labels)
        correct += int((logits.argmax(1) == labels).sum())
        count += len(labels)
    last = read_metrics(run_dir)[-1]
    assert count == len(datasets.open_data(run.config).val)
    assert loss / count == pytest.approx(last["ema_val_loss"], rel=1e-5)
    assert correct / count == pytest.approx(last["ema_val_accuracy"], abs=1e-9)
    assert last["ema_val_loss"] != pytest.approx(last["val_loss"], rel=1e-5)  # the EMA is not the model


def test_logits_are_the_models_in_inference_mode(loaded, sample):
    expected = loaded.model(sample, training=False).numpy()
    np.testing.assert_allclose(loaded.logits(sample), expected, atol=1e-6)
    np.testing.assert_allclose(loaded.logits(sample[:2]), expected[:2], atol=1e-6)  # another batch size


@pytest.fixture(scope="module")
def exports(loaded, sample, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("exports")
    names = {"keras": "model.keras", "savedmodel": "saved", "onnx": "model.onnx"}
    return {fmt: (out / name, loaded.export(fmt, out / name, sample)) for fmt, name in names.items()}


def test_every_format_is_written_and_checked(exports):
    assert inference.EXPORT_FORMATS == ("keras", "savedmodel", "onnx")
    for fmt, (path, report) in exports.items():
        assert report["format"] == fmt and report["layout"] == "NHWC" and report["path"] == str(path)
        assert path.exists()
        assert 0 <= report["max_abs_diff"] <= EXPORT_TOLERANCE


def card_of(text: str, loaded) -> dict:
    card = json.loads(text)
    assert card["extra"]["layout"] == "NHWC" and card["class_names"] == loaded.card.class_names
    assert card["weights"] == "ema" and card["image_size"] == IMAGE_SIZE
    assert card["extra"]["builder"] == {"call": "tf_backend.models.build_model",
                                        "args": ["compact_cnn", CLASSES, IMAGE_SIZE],
                                        "kwargs": {"patch_size": None, "raw": False}}
    return card


def test_the_keras_file_carries_the_card_and_loads_in_plain_keras(loaded, exports, sample):
    path = exports["keras"][0]
    with zipfile.ZipFile(path) as archive:
        card_of(archive.read("model_card.json").decode(), loaded)
    plain = keras.saving.load_model(path, compile=False)  # compact_cnn needs nothing of hvdcls
    np.testing.assert_allclose(plain(sample, training=False).numpy(), loaded.logits(sample), atol=1e-5)


def test_the_savedmodel_carries_the_card_and_serves_any_batch(loaded, exports, sample):
    import tensorflow as tf

    path, report = exports["savedmodel"]
    assert report["card_file"] == str(path / "assets" / "model_card.json")
    card_of((path / "assets" / "model_card.json").read_text(), loaded)
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    for n in (1, 5):
        logits = serve(input=tf.constant(sample[:n]))["logits"].numpy()
        np.testing.assert_allclose(logits, loaded.logits(sample[:n]), atol=1e-5)


def test_the_onnx_file_carries_the_card_and_any_batch(loaded, exports, sample):
    import onnx
    import onnxruntime

    path = exports["onnx"][0]
    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta == loaded.card.onnx_metadata("NHWC")
    assert json.loads(meta["class_names"]) == loaded.card.class_names and meta["layout"] == "NHWC"
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    assert [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == \
        ["batch", IMAGE_SIZE, IMAGE_SIZE, 3]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in (1, 5):
        np.testing.assert_allclose(session.run(None, {"input": sample[:n]})[0], loaded.logits(sample[:n]), atol=1e-4)


def test_a_vit_exports_to_keras_and_loads_back(tmp_path):
    """The ViT's own layers go through keras' file (tf_backend.models.custom_objects)."""
    from hvdcls.modelcard import ModelCard
    from hvdcls.models import ViT
    from tf_backend.vit import vision_transformer

    model = vision_transformer(ViT(4, 16, 1, 2, 32), CLASSES, 16)
    card = ModelCard("tensorflow", "vit_b_16", ["a", "b", "c"], 16, 0.875, [0.5] * 3, [0.5] * 3, patch_size=4)
    vit = inference.TensorFlowInference(model, card, "/CPU:0")
    sample = np.random.default_rng(3).standard_normal((2, 16, 16, 3)).astype(np.float32)
    assert vit.export("keras", tmp_path / "vit.keras", sample)["max_abs_diff"] <= EXPORT_TOLERANCE


def test_bad_requests_are_one_line(loaded, sample, tmp_path):
    with pytest.raises(UserError, match="export format 'onnx2': the tensorflow backend writes keras, savedmodel, onnx"):
        loaded.export("onnx2", tmp_path / "m.onnx", sample)
    with pytest.raises(UserError, match=r"the keras export is a \.keras file: .*m\.h5 \(use m\.keras\)"):
        loaded.export("keras", tmp_path / "m.h5", sample)
    with pytest.raises(UserError, match="device 'tpu': use auto, cpu, cuda or cuda:N"):
        inference.pick_device("tpu")


def test_a_checkpoint_that_does_not_fit_its_card_is_one_line(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    card = json.loads((copy / "model_card.json").read_text())
    (copy / "model_card.json").write_text(json.dumps({**card, "class_names": ["a", "b", "c", "d"]}))
    head = rf"dense(_\d+)?: {CLASSES} -> 4 classes"  # the layer's name: dense_N after other builds
    with pytest.raises(UserError, match=f"does not fit compact_cnn with 4 classes: {head}"):
        inference.load(open_run(copy), "cpu")
