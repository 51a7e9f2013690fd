"""model.weights: what it names, and the preprocessing that comes with it (hvdcls.pretrained),
layered into data.mean/std under whatever the user sets (hvdcls.config)."""
import json

import pytest

from hvdcls import config as cfg
from hvdcls import modelcard, pretrained
from hvdcls.errors import UserError
from hvdcls.pretrained import CAFFE_MEAN_RGB, IMAGENET_MEAN, IMAGENET_STD


def test_parse_tells_names_files_and_runs_apart(tmp_path):
    weights = tmp_path / "r18.pth"
    weights.write_bytes(b"x")
    run = tmp_path / "run"
    run.mkdir()
    assert pretrained.parse(None).kind == "none"
    assert pretrained.parse("none").kind == "none"
    assert pretrained.parse("IMAGENET1K_V2") == pretrained.WeightsSource("framework", "IMAGENET1K_V2")
    assert pretrained.parse("imagenet").kind == "framework"
    assert pretrained.parse(str(weights)) == pretrained.WeightsSource("file", str(weights))
    assert pretrained.parse(str(run)).kind == "run"


@pytest.mark.parametrize("text", ["missing.pth", "weights/r18.safetensors", "./nothing", "m.weights.h5"])
def test_a_path_that_does_not_exist_is_one_line(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="no such file"):
        pretrained.parse(text)


@pytest.mark.parametrize("model, mode", [("ResNet50", "caffe"), ("vgg16", "caffe"), ("MobileNetV2", "tf"),
                                         ("resnet50_v2", "tf"), ("DenseNet121", "torch"),
                                         ("EfficientNetB0", "raw"), ("ConvNeXtTiny", "raw")])
def test_keras_modes_follow_each_application(model, mode):
    assert pretrained.keras_mode(model) == mode


def test_each_convention_gives_the_numbers_keras_would_feed():
    """(p/255 - mean) / std on an RGB pixel equals keras' preprocess_input of that pixel."""
    import numpy as np

    pixel = np.array([200.0, 100.0, 50.0])  # RGB in [0, 255]
    for model, expected in [("resnet50", pixel - np.array([123.68, 116.779, 103.939])),  # caffe, in RGB order
                            ("mobilenet", pixel / 127.5 - 1),
                            ("efficientnetb0", pixel)]:
        found = pretrained.keras_preprocessing(model)
        got = (pixel / 255 - np.array(found.mean)) / np.array(found.std)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-4)
    assert pretrained.keras_preprocessing("resnet50").bgr


def test_the_weights_preprocessing_is_a_default_the_user_overrides(tmp_path):
    plain = cfg.load(overrides=["data.name=synthetic", "model.weights=imagenet", "model.name=resnet50"])
    assert plain.data.mean == pytest.approx(CAFFE_MEAN_RGB) and plain.data.std == pytest.approx([1 / 255] * 3)
    torchvision = cfg.load(overrides=["model.weights=DEFAULT", "model.name=resnet18"])  # over digits' 0.5
    assert torchvision.data.mean == pytest.approx(IMAGENET_MEAN) and torchvision.data.std == pytest.approx(IMAGENET_STD)
    mine = cfg.load(overrides=["model.weights=imagenet", "model.name=mobilenet", "data.mean=[0.1,0.2,0.3]"])
    assert mine.data.mean == [0.1, 0.2, 0.3] and mine.data.std == [0.5] * 3  # the unset key still follows


def test_a_run_brings_its_model_cards_preprocessing(tmp_path):
    run = tmp_path / "run"
    card = modelcard.ModelCard("torch", "resnet18", ["a", "b"], 32, 1.0, [0.2, 0.3, 0.4], [0.5, 0.6, 0.7])
    modelcard.write(run, card)
    (run / "checkpoints" / "epoch-0001").mkdir(parents=True)
    loaded = cfg.load(overrides=["data.name=synthetic", f"model.weights={run}"])
    assert loaded.data.mean == [0.2, 0.3, 0.4] and loaded.data.std == [0.5, 0.6, 0.7]
    assert modelcard.find(run / "checkpoints" / "epoch-0001") == card
    assert pretrained.preprocessing(pretrained.parse(str(tmp_path)), "x") is None  # no card there


def test_the_card_as_onnx_metadata_is_strings_and_json():
    card = modelcard.ModelCard("tensorflow", "compact_cnn", ["cat", "dog"], 16, 0.875, [0.5] * 3, [0.25] * 3)
    meta = card.onnx_metadata("NHWC")
    assert all(isinstance(v, str) for v in meta.values())
    assert json.loads(meta["class_names"]) == ["cat", "dog"] and json.loads(meta["std"]) == [0.25] * 3
    assert float(meta["crop_fraction"]) == 0.875 and int(meta["image_size"]) == 16 and meta["layout"] == "NHWC"
    assert modelcard.ModelCard.from_dict({**card.to_dict(), "unknown_later_key": 1}) == card
