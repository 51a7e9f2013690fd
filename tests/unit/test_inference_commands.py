"""`hvdcls evaluate`, `export` and `predict` through the CLI, with a numpy model standing in for
a backend's (and for ONNX Runtime): the files written, the CSV, the exit statuses.

The "model" scores an image by how close its mean colour is to each class's colour; the images
are solid colours, so every prediction is known in advance.
"""
import csv
import io
import json
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hvdcls import cli, modelcard, registry
from hvdcls import config as cfg
from hvdcls.errors import UserError
from hvdcls.inference import onnx_model
from hvdcls.inference.contract import InferenceModel
from hvdcls.inference.images import read_in_workers

CLASSES = ["amber", "blue", "cyan", "green", "magenta", "red"]  # six: top-5 is a number
COLOURS = np.array([[255, 191, 0], [0, 0, 255], [0, 255, 255], [0, 255, 0], [255, 0, 255], [255, 0, 0]])


class ColourModel(InferenceModel):
    """Logits: minus the squared distance of an image's mean colour from each class's."""

    def __init__(self, card):
        self.card = card
        self.exported = []

    def logits(self, images):
        means = images.mean(axis=(1, 2))  # the card's mean 0, std 1: pixels in [0, 1]
        return -((means[:, None, :] - COLOURS[None] / 255.0) ** 2).sum(-1).astype(np.float32) * 10

    def batches(self, batches, workers):
        for images, labels in read_in_workers(batches, workers):
            yield self.logits(images), labels

    def export(self, fmt, path, sample):
        if fmt == "savedmodel":
            path.mkdir()
            (path / "saved_model.pb").write_bytes(b"graph")
        else:
            path.write_bytes(b"weights")
            Path(f"{path}.json").write_text("{}")  # a card beside it, as torch's .pth export writes
        if fmt == "broken":
            raise UserError("the export's outputs differ from the framework's by 0.5")
        self.exported.append((fmt, path, sample.shape))
        return {"format": fmt, "max_abs_diff": 3e-7, "layout": "NHWC"}


def solid(path, colour, size=(12, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size[1], size[0], 3), colour, np.uint8)).save(path)


def image_folder(root, classes=CLASSES, mislabel=True):
    """train/ and val/, two images a class; val/red holds one magenta image (a known mistake)."""
    for split in ("train", "val"):
        for name, colour in zip(CLASSES, COLOURS):
            if name in classes:
                for i in range(2):
                    solid(root / split / name / f"{i}.png", colour)
    if mislabel:
        solid(root / "val" / "red" / "1.png", COLOURS[CLASSES.index("magenta")])
    return root


@pytest.fixture
def fake_backend(monkeypatch):
    models = []

    def load(run, device="auto"):
        models.append(ColourModel(run.card))
        return models[-1]

    module = types.SimpleNamespace(load=load, EXPORT_FORMATS=("npy", "savedmodel", "broken"), models=models)
    monkeypatch.setattr(registry, "load", lambda name, submodule: module)
    return module


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as training leaves it: config.yaml, model_card.json, a checkpoint."""
    data = image_folder(tmp_path / "data")
    config = cfg.load(overrides=[f"data.path={data}", "data.image_size=8", "data.mean=[0,0,0]",
                                 "data.std=[1,1,1]", "training.ema_decay=0.99"])
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "epoch-0001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps({"backend": "torch"}))
    (run / "config.yaml").write_text(cfg.to_yaml(config))
    card = modelcard.from_config(config, "torch", CLASSES)
    card.weights = "ema"
    modelcard.write(run, card)
    return run


def hvdcls(capsys, *argv):
    """(exit status, stdout, stderr) of `hvdcls ARGV`, in this process."""
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_evaluate_writes_the_three_files(run_dir, fake_backend, capsys):
    status, out, _ = hvdcls(capsys, "evaluate", run_dir, "-b", 5, "-j", 0)
    assert status == 0
    result = json.loads((run_dir / "evaluation.json").read_text())
    assert {"top1", "top5", "per_class", "confusion_matrix", "data", "weights"} <= set(result)
    assert result["weights"] == "ema" and result["class_names"] == CLASSES
    assert result["top1"] == pytest.approx(11 / 12) and result["top5"] == 1.0
    red, magenta = CLASSES.index("red"), CLASSES.index("magenta")
    assert result["confusion_matrix"][red][magenta] == 1  # row: true class, column: predicted
    assert result["per_class"]["red"] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}
    assert result["data"]["images"] == 12 and result["data"]["split"] == "val/"
    rows = list(csv.reader(io.StringIO((run_dir / "confusion_matrix.csv").read_text())))
    assert rows[0][1:] == CLASSES and [r[0] for r in rows[1:]] == CLASSES
    assert [int(v) for v in rows[1 + red][1:]] == result["confusion_matrix"][red]
    assert (run_dir / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "top-1 91.67%" in out and "lowest F1: red 0.667, magenta 0.800, amber 1.000" in out


def test_evaluate_other_data_all_of_a_folder_without_val(run_dir, fake_backend, tmp_path, capsys):
    other = image_folder(tmp_path / "other", mislabel=False) / "train"
    status, _, _ = hvdcls(capsys, "evaluate", run_dir, "--data", other, "--output-dir", tmp_path / "out", "-j", 0)
    assert status == 0
    result = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert result["top1"] == 1.0 and result["data"]["split"] == "all" and result["data"]["path"] == str(other)
    assert not (run_dir / "evaluation.json").exists()


def test_evaluate_an_lmdb_files_val_split(run_dir, fake_backend, tmp_path, capsys):
    from hvdcls.data import lmdb_store

    lmdb_store.pack(image_folder(tmp_path / "tree"), tmp_path / "data.lmdb", progress=False)
    status, _, _ = hvdcls(capsys, "evaluate", run_dir, "--data", tmp_path / "data.lmdb", "-j", 0)
    result = json.loads((run_dir / "evaluation.json").read_text())
    assert status == 0 and result["top1"] == pytest.approx(11 / 12)
    assert result["data"]["format"] == "lmdb" and result["data"]["split"] == "val" and result["data"]["images"] == 12


def test_evaluate_names_an_unreadable_image_under_the_runs_fail_policy(run_dir, fake_backend, tmp_path, capsys):
    other = image_folder(tmp_path / "other", mislabel=False)
    (other / "val" / "red" / "broken.png").write_bytes(b"not a png")
    status, _, err = hvdcls(capsys, "evaluate", run_dir, "--data", other, "-j", 0)
    assert status == 2 and "broken.png" in err and "data.bad_files=skip" in err and err.count("\n") == 1


def test_evaluate_refuses_data_whose_classes_differ(run_dir, fake_backend, tmp_path, capsys):
    other = image_folder(tmp_path / "other", classes=CLASSES[:5], mislabel=False)
    (other / "val" / "violet").mkdir()
    solid(other / "val" / "violet" / "0.png", (127, 0, 255))
    status, _, err = hvdcls(capsys, "evaluate", run_dir, "--data", other)
    assert status == 2
    assert err.strip().count("\n") == 0
    assert "only in the data: ['violet'], only in the model: ['red']" in err
    assert not fake_backend.models  # refused before the model was loaded


def read_csv(text):
    return list(csv.reader(io.StringIO(text)))


def test_predict_top_k_csv_and_a_skipped_image(run_dir, fake_backend, tmp_path, capsys):
    photos = tmp_path / "photos"
    solid(photos / "b.png", COLOURS[CLASSES.index("blue")])
    solid(photos / "deep" / "a.jpg", COLOURS[CLASSES.index("red")])
    (photos / "deep" / "broken.jpg").write_bytes(b"not a jpeg")
    (photos / "notes.txt").write_text("not an image suffix: not read")
    output = tmp_path / "out" / "predictions.csv"
    status, out, err = hvdcls(capsys, "predict", run_dir, photos, "--top-k", 3, "-o", output, "-b", 2, "-j", 2)
    assert status == 1
    assert f"skipped {photos / 'deep' / 'broken.jpg'}: not an image format" in err and out == ""
    rows = read_csv(output.read_text())
    assert rows[0] == ["path", "class", "probability", "class_2", "probability_2", "class_3", "probability_3"]
    assert [r[0] for r in rows[1:]] == [str(photos / "b.png"), str(photos / "deep" / "a.jpg")]
    assert [rows[1][1], rows[2][1]] == ["blue", "red"]
    assert rows[2][3] == "amber"  # the colour nearest red after red
    probabilities = [float(v) for v in rows[1][2::2]]
    assert probabilities == sorted(probabilities, reverse=True) and 0 < sum(probabilities) <= 1.000001


def test_predict_writes_to_stdout_and_exits_0_when_all_were_read(run_dir, fake_backend, tmp_path, capsys):
    image = tmp_path / "one.png"
    solid(image, COLOURS[0])
    status, out, _ = hvdcls(capsys, "predict", run_dir / "checkpoints" / "epoch-0001", image, "-j", 0)
    rows = read_csv(out)
    assert status == 0 and len(rows) == 2
    assert rows[0] == ["path", "class", "probability"] and rows[1][:2] == [str(image), "amber"]


@pytest.mark.parametrize("argv, message", [
    (["predict", "{run}", "{empty}"], "no images found"),
    (["predict", "{run}", "{image}", "--top-k", "0"], "--top-k must be at least 1"),
    (["predict", "{tmp}/missing", "{image}"], "MODEL {tmp}/missing: no such file"),
    (["predict", "{run}", "{tmp}/nothing.jpg"], "image path {tmp}/nothing.jpg: no such file"),
])
def test_predict_bad_input_is_one_line_and_exit_2(run_dir, fake_backend, tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    solid(tmp_path / "image.png", COLOURS[0])
    names = {"run": run_dir, "empty": tmp_path / "empty", "image": tmp_path / "image.png", "tmp": tmp_path}
    status, _, err = hvdcls(capsys, *[a.format(**names) for a in argv])
    assert status == 2
    assert err.startswith("hvdcls: error: ") and message.format(**names) in err and err.count("\n") == 1


def test_export_checks_the_format_and_renames_into_place(run_dir, fake_backend, tmp_path, capsys):
    status, _, err = hvdcls(capsys, "export", run_dir, "--format", "onnx", "-o", tmp_path / "m.onnx")
    assert status == 2 and "the torch backend exports npy, savedmodel, broken" in err
    output = tmp_path / "exports" / "m.npy"
    status, out, _ = hvdcls(capsys, "export", run_dir, "--format", "npy", "-o", output)
    assert status == 0 and output.read_bytes() == b"weights"
    assert "npy: " in out and "7 B" in out and "3.0e-07" in out and "4 images of the run's validation split" in out
    fmt, written, shape = fake_backend.models[-1].exported[-1]
    assert written.parent == output.parent and written.name.startswith(".") and shape == (4, 8, 8, 3)
    assert sorted(p.name for p in output.parent.iterdir()) == ["m.npy", "m.npy.json"]  # nothing hidden left


def test_a_failed_export_leaves_the_old_output(run_dir, fake_backend, tmp_path, capsys):
    output = tmp_path / "m.bin"
    output.write_bytes(b"old")
    status, _, err = hvdcls(capsys, "export", run_dir, "--format", "broken", "-o", output)
    assert status == 2 and "differ" in err
    assert output.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_directory_export_replaces_the_old_directory(run_dir, fake_backend, tmp_path, capsys):
    output = tmp_path / "saved"
    output.mkdir()
    (output / "notes.txt").write_text("the user's")
    status, _, err = hvdcls(capsys, "export", run_dir, "--format", "savedmodel", "-o", output)
    assert status == 2 and "holds no savedmodel export" in err and (output / "notes.txt").is_file()
    status, _, err = hvdcls(capsys, "export", run_dir, "--format", "npy", "-o", output)
    assert status == 2 and "is a directory: name the file" in err
    (output / "notes.txt").unlink()
    (output / "saved_model.pb").write_text("from an older export")
    (output / "stale.txt").write_text("from an older export")
    status, _, _ = hvdcls(capsys, "export", run_dir, "--format", "savedmodel", "-o", output)
    assert status == 0 and sorted(p.name for p in output.iterdir()) == ["saved_model.pb"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_falls_back_to_random_inputs_when_the_data_is_gone(run_dir, fake_backend, tmp_path, capsys):
    import shutil

    shutil.rmtree(tmp_path / "data")
    status, out, err = hvdcls(capsys, "export", run_dir, "--format", "npy", "-o", tmp_path / "m.npy")
    assert status == 0 and "random inputs" in out and "cannot be read" in err


class FakeSession:
    """ONNX Runtime's InferenceSession over a JSON "model file": its metadata and layout."""

    def __init__(self, path, providers):
        self.meta = json.loads(Path(path).read_text())
        self.card = types.SimpleNamespace(custom_metadata_map=self.meta)

    def get_modelmeta(self):
        return self.card

    def get_inputs(self):
        return [types.SimpleNamespace(name="images")]

    def run(self, outputs, feed):
        images = feed["images"]
        assert images.shape[1] == 3 and images.flags.c_contiguous  # NCHW, as the metadata says
        return [ColourModel(None).logits(images.transpose(0, 2, 3, 1))]


@pytest.fixture
def fake_onnxruntime(monkeypatch):
    module = types.SimpleNamespace(InferenceSession=FakeSession,
                                   get_available_providers=lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(onnx_model, "_onnxruntime", lambda: module)


def test_predict_with_an_onnx_file_reads_its_metadata_alone(run_dir, fake_onnxruntime, tmp_path, capsys):
    card = modelcard.find(run_dir)
    card.image_size = 6
    model_file = tmp_path / "model.onnx"
    model_file.write_text(json.dumps(card.onnx_metadata("NCHW")))
    solid(tmp_path / "p" / "x.png", COLOURS[CLASSES.index("cyan")])
    status, out, _ = hvdcls(capsys, "predict", model_file, tmp_path / "p", "-k", 2, "-j", 0)
    assert status == 0 and read_csv(out)[1][1] == "cyan"
    loaded = onnx_model.load(model_file)
    assert loaded.card.class_names == CLASSES and loaded.card.image_size == 6 and loaded.layout == "NCHW"


def test_an_onnx_file_without_metadata_is_one_line(fake_onnxruntime, tmp_path, capsys):
    model_file = tmp_path / "plain.onnx"
    model_file.write_text(json.dumps({"layout": "NCHW"}))
    solid(tmp_path / "x.png", COLOURS[0])
    status, _, err = hvdcls(capsys, "predict", model_file, tmp_path / "x.png")
    assert status == 2 and "has no hvdcls metadata (class_names, image_size" in err and err.count("\n") == 1


def colour_onnx(path, card, opset=17):
    """A real ONNX file of ColourModel (NCHW: the mean colour, then minus its squared distance
    from each class's colour, x10), written with onnx.helper and hvdcls's metadata."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    colours = numpy_helper.from_array((COLOURS / 255.0).astype(np.float32).T[None], "colours")  # (1, 3, C)
    nodes = [helper.make_node("ReduceMean", ["input"], ["mean"], axes=[2, 3], keepdims=1),  # (N, 3, 1, 1)
             helper.make_node("Squeeze", ["mean", "last"], ["rgb"]),  # (N, 3, 1)
             helper.make_node("Sub", ["rgb", "colours"], ["diff"]),
             helper.make_node("Mul", ["diff", "diff"], ["squared"]),
             helper.make_node("ReduceSum", ["squared", "channels"], ["distance"], keepdims=0),
             helper.make_node("Mul", ["distance", "scale"], ["logits"])]
    constants = [colours, numpy_helper.from_array(np.array([3], np.int64), "last"),
                 numpy_helper.from_array(np.array([1], np.int64), "channels"),
                 numpy_helper.from_array(np.array(-10.0, np.float32), "scale")]
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, None, None])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(CLASSES)])]
    graph = helper.make_graph(nodes, "colours", inputs, outputs, constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    for key, value in card.onnx_metadata("NCHW").items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    return path


def test_predict_with_a_real_onnx_file_and_onnx_runtime(run_dir, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    model_file = colour_onnx(tmp_path / "colours.onnx", modelcard.find(run_dir))
    for name in ("green", "magenta", "amber"):
        solid(tmp_path / "p" / f"{name}.jpg", COLOURS[CLASSES.index(name)], size=(30, 20))
    status, out, _ = hvdcls(capsys, "predict", model_file, tmp_path / "p", "-k", 6, "-j", 2, "-b", 2)
    rows = read_csv(out)
    assert status == 0 and [row[1] for row in rows[1:]] == ["amber", "green", "magenta"]
    model = onnx_model.load(model_file)
    sample = np.random.default_rng(0).random((2, 8, 8, 3), np.float32)
    np.testing.assert_allclose(model.logits(sample), ColourModel(None).logits(sample), rtol=1e-5, atol=1e-5)
