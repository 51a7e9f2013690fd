"""torch_backend.inference: a run loaded for evaluation gives the logits training's validation
saw, and each export format is written, carries the card and is checked against the model.

One real one-epoch run on synthetic data (compact_cnn, with an EMA) for the loading and the
exports; a resnet18 run written by hand for what a plain torchvision script can load.
"""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision

from hvdcls.errors import UserError
from hvdcls.inference.contract import EXPORT_TOLERANCE
from hvdcls.inference.run import open_run
from tests.run_files import read_metrics, val_epoch
from tests.torch_backend.run_layout import hvdcls_train, write_run
from torch_backend import inference, models

CLASSES = 3


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    work = tmp_path_factory.mktemp("torch-inference")
    hvdcls_train(work, "--output-dir", str(work / "run"), "model.name=compact_cnn",
                 f"data.synthetic.num_classes={CLASSES}", "training.ema_decay=0.5")
    return work / "run"


@pytest.fixture(scope="module")
def loaded(run_dir):
    return inference.load(open_run(run_dir), "cpu")


@pytest.fixture(scope="module")
def sample(loaded) -> np.ndarray:
    side = loaded.card.image_size
    return np.random.default_rng(0).standard_normal((5, side, side, 3)).astype(np.float32)


def test_a_run_gives_the_logits_its_validation_saw(run_dir, loaded):
    """The card says EMA, so the EMA's validation loss and accuracy are matched exactly."""
    run = open_run(run_dir)
    assert loaded.card.weights == "ema" and loaded.card.num_classes == CLASSES
    assert not loaded.model.training
    loss, correct, count = 0.0, 0, 0
    for logits, labels in loaded.batches(val_epoch(run), workers=0):
        assert logits.dtype == np.float32 and logits.shape == (len(labels), CLASSES)
        loss += float(F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels), reduction="sum"))
        correct += int((logits.argmax(1) == labels).sum())
        count += len(labels)
    last = read_metrics(run_dir)[-1]
    assert loss / count == pytest.approx(last["ema_val_loss"], rel=1e-5)
    assert correct / count == pytest.approx(last["ema_val_accuracy"], abs=1e-9)
    assert last["ema_val_loss"] != pytest.approx(last["val_loss"], rel=1e-5)  # the EMA is not the model


def test_logits_of_nhwc_images_are_the_models_on_nchw(loaded, sample):
    with torch.no_grad():
        expected = loaded.model(torch.from_numpy(sample).permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(loaded.logits(sample), expected, atol=1e-6)


@pytest.fixture(scope="module")
def exports(loaded, sample, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("exports")
    names = {"state-dict": "model.safetensors", "state-dict-pth": "model.pth", "torchscript": "model.pt",
             "onnx": "model.onnx"}
    return {key: (out / name, loaded.export(key.removesuffix("-pth"), out / name, sample))
            for key, name in names.items()}


def test_every_format_is_written_and_checked(exports):
    assert inference.EXPORT_FORMATS == ("state-dict", "torchscript", "onnx")
    for key, (path, report) in exports.items():
        assert report["format"] == key.removesuffix("-pth") and report["layout"] == "NCHW"
        assert report["path"] == str(path) and path.stat().st_size > 1000
        assert 0 <= report["max_abs_diff"] <= EXPORT_TOLERANCE


def test_the_onnx_file_carries_the_card_and_any_batch(loaded, exports, sample):
    import onnx
    import onnxruntime

    path = exports["onnx"][0]
    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta == loaded.card.onnx_metadata("NCHW")
    assert json.loads(meta["class_names"]) == loaded.card.class_names and meta["layout"] == "NCHW"
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in (1, 5):
        images = np.ascontiguousarray(sample[:n].transpose(0, 3, 1, 2))
        np.testing.assert_allclose(session.run(None, {"input": images})[0], loaded.logits(sample[:n]), atol=1e-4)


def card_of(text: str) -> dict:
    card = json.loads(text)
    assert card["extra"]["layout"] == "NCHW"
    return card


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_the_state_dict_and_torchscript_exports_carry_the_card(loaded, exports, sample):
    from safetensors import safe_open

    with safe_open(str(exports["state-dict"][0]), framework="pt") as handle:
        meta = handle.metadata()
    card = card_of(meta["hvdcls_card"])
    assert card["class_names"] == loaded.card.class_names and card["weights"] == "ema"
    assert json.loads(meta["builder"]) == card["extra"]["builder"] == {
        "call": "torch_backend.models.build_model", "args": ["compact_cnn", CLASSES],
        "kwargs": {"image_size": 16, "patch_size": None}}
    path, report = exports["state-dict-pth"]
    assert card_of((path.parent / "model.pth.json").read_text()) == card
    assert report["card_file"] == f"{path}.json"
    extra = {"model_card.json": ""}
    scripted = torch.jit.load(str(exports["torchscript"][0]), _extra_files=extra)
    assert card_of(extra["model_card.json"]) == card
    with torch.no_grad():
        logits = scripted(torch.from_numpy(sample).permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(logits, loaded.logits(sample), atol=1e-5)


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory):
    """A resnet18 run written by hand, loaded: what torchvision scripts would load."""
    torch.manual_seed(3)
    state = torchvision.models.get_model("resnet18", num_classes=CLASSES).state_dict()
    run = write_run(tmp_path_factory.mktemp("r18") / "run", "torch", {"model": state}, model="resnet18")
    return inference.load(open_run(run), "cpu")


@pytest.mark.parametrize("name", ["r18.pth", "r18.safetensors"])
def test_a_state_dict_export_loads_into_plain_torchvision(resnet18, tmp_path, name):
    side = resnet18.card.image_size
    sample = np.random.default_rng(1).standard_normal((2, side, side, 3)).astype(np.float32)
    report = resnet18.export("state-dict", tmp_path / name, sample)
    assert report["max_abs_diff"] <= EXPORT_TOLERANCE
    plain = torchvision.models.get_model("resnet18", num_classes=CLASSES)
    if name.endswith(".pth"):
        plain.load_state_dict(torch.load(tmp_path / name))
        builder = json.loads((tmp_path / f"{name}.json").read_text())["extra"]["builder"]
    else:
        from safetensors.torch import load_file, safe_open

        plain.load_state_dict(load_file(str(tmp_path / name)))
        with safe_open(str(tmp_path / name), framework="pt") as handle:
            builder = json.loads(handle.metadata()["builder"])
    assert builder == {"call": "torchvision.models.get_model", "args": ["resnet18"],
                       "kwargs": {"num_classes": CLASSES}}
    with torch.no_grad():
        logits = plain.eval()(torch.from_numpy(sample).permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(logits, resnet18.logits(sample), atol=1e-5)


def test_an_unknown_format_is_one_line(loaded, sample, tmp_path):
    with pytest.raises(UserError, match="export format 'keras': the torch backend writes state-dict, "
                                        "torchscript, onnx"):
        loaded.export("keras", tmp_path / "m.keras", sample)


def test_a_checkpoint_that_does_not_fit_its_card_is_one_line(tmp_path):
    run = write_run(tmp_path / "run", "torch", {"model": models.compact_cnn(CLASSES + 1).state_dict()})
    with pytest.raises(UserError, match="does not fit compact_cnn with 3 classes"):
        inference.load(open_run(run), "cpu")


def test_a_timm_models_state_dict_export_loads_into_plain_timm(tmp_path):
    timm = pytest.importorskip("timm")
    state = models.build_model("timm/resnet18", CLASSES).state_dict()
    loaded = inference.load(open_run(write_run(tmp_path / "run", "torch", {"model": state},
                                               model="timm/resnet18")), "cpu")
    sample = np.random.default_rng(2).standard_normal((2, 16, 16, 3)).astype(np.float32)
    loaded.export("state-dict", tmp_path / "t.pth", sample)
    builder = json.loads((tmp_path / "t.pth.json").read_text())["extra"]["builder"]
    assert builder == {"call": "timm.create_model", "args": ["resnet18"], "kwargs": {"num_classes": CLASSES}}
    plain = timm.create_model(*builder["args"], **builder["kwargs"])
    plain.load_state_dict(torch.load(tmp_path / "t.pth"))
    with torch.no_grad():
        logits = plain.eval()(torch.from_numpy(sample).permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(logits, loaded.logits(sample), atol=1e-5)
