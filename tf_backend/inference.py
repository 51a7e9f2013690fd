"""A trained tensorflow run for the inference commands (hvdcls/inference/contract.py): evaluate,
predict and export, in one process, without Horovod.

    load(run, device="auto") -> TensorFlowInference   the checkpoint's weights (the EMA's when kept)
    export formats: keras (a .keras file, the card inside its zip as model_card.json),
                    savedmodel (a directory, signature serving_default, the card as the asset
                    model_card.json), onnx by tf2onnx (the card as metadata_props)

Every export takes NHWC float32 images normalised by the card's mean and std (input "input",
any batch size, output "logits"), and is loaded back and run on a sample before it is accepted.

Mirror: torch_backend/inference.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from hvdcls.data.batches import EpochBatches
from hvdcls.errors import UserError
from hvdcls.inference.contract import InferenceModel, check_export
from hvdcls.inference.run import RunModel
from hvdcls.modelcard import CARD_FILE, ModelCard
from tf_backend import consolidate, data, models
from tf_backend.weights import CHECKPOINT_FILE, check_backend, load_run

EXPORT_FORMATS = ("keras", "savedmodel", "onnx")
CONSOLIDATED_SUFFIX = ".npz"  # hvdcls checkpoint consolidate's file
LAYOUT = "NHWC"
SIGNATURE = "serving_default"  # the SavedModel's signature: input -> {"logits"}
ONNX_OPSET = 17


def load(run: RunModel, device: str = "auto") -> "TensorFlowInference":
    """The run's model in inference mode on `device` (auto: a GPU when TensorFlow sees one)."""
    card = run.card
    placed = pick_device(device)
    with tf.device(placed):
        model = models.build_model(card.model, card.num_classes, card.image_size, card.patch_size,
                                   models.raw_pixels(card.mean, card.std))
        load_run(model, run)
    return TensorFlowInference(model, card, placed)


def sharded_run(run: RunModel) -> Optional[consolidate.ShardedModel]:
    """A training.zero=3 run's model, read from its shard files (`hvdcls checkpoint
    consolidate`: .write(FILE) writes it as one .npz in tensorflow.npz's layout); None when not sharded."""
    check_backend(run)
    return consolidate.sharded_model(run.checkpoint_dir, run.checkpoint_dir / CHECKPOINT_FILE,
                                     str(run.checkpoint_dir / CHECKPOINT_FILE))


def pick_device(device: str) -> str:
    """auto | cpu | cuda | cuda:N as a TensorFlow device name; a GPU it does not see is one line."""
    gpus = tf.config.list_logical_devices("GPU")
    if device == "auto":
        return "/GPU:0" if gpus else "/CPU:0"
    if device == "cpu":
        return "/CPU:0"
    kind, _, index = device.partition(":")
    if kind != "cuda" or not (index or "0").isdigit():
        raise UserError(f"device {device!r}: use auto, cpu, cuda or cuda:N")
    if int(index or 0) >= len(gpus):
        raise UserError(f"device {device}: TensorFlow sees {len(gpus)} GPU(s)")
    return f"/GPU:{int(index or 0)}"


class TensorFlowInference(InferenceModel):
    def __init__(self, model: keras.Model, card: ModelCard, device: str):
        self.model, self.card, self.device = model, card, device
        # compiled once: one trace per batch shape (the last, smaller batch makes a second)
        self.forward = tf.function(lambda images: tf.cast(model(images, training=False), tf.float32),
                                   reduce_retracing=True)

    def run(self, images) -> np.ndarray:
        with tf.device(self.device):
            return self.forward(tf.convert_to_tensor(images, tf.float32)).numpy()

    def logits(self, images: np.ndarray) -> np.ndarray:
        return self.run(np.asarray(images, np.float32))

    def batches(self, batches: EpochBatches, workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for images, labels in data.loader(batches, workers):  # tf.data's threads read ahead
            yield self.run(images), np.asarray(labels)

    def export(self, fmt: str, path: Path, sample: np.ndarray) -> dict:
        if fmt not in EXPORTERS:
            raise UserError(f"export format {fmt!r}: the tensorflow backend writes {', '.join(EXPORT_FORMATS)}")
        path = Path(path)
        sample = np.asarray(sample, np.float32)
        expected = self.logits(sample)
        written = EXPORTERS[fmt](self.model, export_card(self.card), path, sample)
        return {"format": fmt, "layout": LAYOUT, "path": str(path),
                **check_export(fmt, expected, written.pop("outputs")), **written}


def export_card(card: ModelCard) -> ModelCard:
    """The run's card with what an export adds: its layout and how to build the model again."""
    builder = {"call": "tf_backend.models.build_model", "args": [card.model, card.num_classes, card.image_size],
               "kwargs": {"patch_size": card.patch_size, "raw": models.raw_pixels(card.mean, card.std)}}
    return dataclasses.replace(card, extra={**card.extra, "layout": LAYOUT, "builder": builder})


def card_json(card: ModelCard) -> str:
    return json.dumps(card.to_dict(), indent=2, sort_keys=True) + "\n"



def export_keras(model: keras.Model, card: ModelCard, path: Path, images: np.ndarray) -> dict:
    """Keras' own .keras file with the card added to its zip (keras reads only its own members);
    checked through keras.saving.load_model."""
    if path.suffix != ".keras":
        raise UserError(f"the keras export is a .keras file: {path} (use {path.with_suffix('.keras').name})")
    model.save(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(CARD_FILE, card_json(card))
    loaded = keras.saving.load_model(path, custom_objects=models.custom_objects(), compile=False)
    return {"outputs": np.asarray(loaded(images, training=False), np.float32)}


def serving_module(model: keras.Model, card: ModelCard) -> tf.Module:
    """What a SavedModel keeps: the model's variables, its forward as the serving signature
    (NHWC float32 of the card's size, any batch -> {"logits"}), the card as an asset."""
    module = tf.Module()
    module.model = model
    size = card.image_size
    spec = tf.TensorSpec([None, size, size, 3], tf.float32, name="input")
    module.serve = tf.function(lambda images: {"logits": tf.cast(model(images, training=False), tf.float32)},
                               input_signature=[spec])
    return module


def export_savedmodel(model: keras.Model, card: ModelCard, path: Path, images: np.ndarray) -> dict:
    """A SavedModel directory, the card as assets/model_card.json; checked through
    tf.saved_model.load and its serving signature."""
    module = serving_module(model, card)
    with card_asset(card) as asset:
        module.card = tf.saved_model.Asset(str(asset))
        tf.saved_model.save(module, str(path), signatures={SIGNATURE: module.serve})
    loaded = tf.saved_model.load(str(path))
    card_file = Path(loaded.card.asset_path.numpy().decode())
    if json.loads(card_file.read_text()) != card.to_dict():
        raise UserError(f"the savedmodel export {path} lost its {CARD_FILE}")
    outputs = loaded.signatures[SIGNATURE](input=tf.constant(images))["logits"]
    return {"outputs": outputs.numpy(), "card_file": str(card_file)}


@contextmanager
def card_asset(card: ModelCard) -> Iterator[Path]:
    """The card as a file named model_card.json, for the SavedModel to copy into its assets."""
    folder = Path(tempfile.mkdtemp(prefix="hvdcls-card-"))
    try:
        (folder / CARD_FILE).write_text(card_json(card))
        yield folder / CARD_FILE
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def export_onnx(model: keras.Model, card: ModelCard, path: Path, images: np.ndarray) -> dict:
    """ONNX by tf2onnx from the forward function, input "input" (NHWC, a dynamic batch axis)
    and output "logits", the card as metadata_props; checked with ONNX Runtime's CPU provider."""
    import onnx
    import onnxruntime
    import tf2onnx

    module = serving_module(model, card)
    proto, _ = tf2onnx.convert.from_function(module.serve, input_signature=module.serve.input_signature,
                                             opset=ONNX_OPSET)
    for key, value in card.onnx_metadata(LAYOUT).items():
        proto.metadata_props.add(key=key, value=value)
    for value in (*proto.graph.input, *proto.graph.output):  # tf2onnx calls the free axis unk__N
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(proto, str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return {"outputs": session.run(["logits"], {"input": images})[0]}


EXPORTERS: dict[str, Callable[[keras.Model, ModelCard, Path, np.ndarray], dict]] = {
    "keras": export_keras, "savedmodel": export_savedmodel, "onnx": export_onnx}
