"""An ONNX export as an InferenceModel: run by ONNX Runtime, its class names and preprocessing
read from the file's metadata alone (`metadata_props`, as hvdcls.modelcard.ModelCard.onnx_metadata
writes them: every value a string, lists as JSON). Neither torch nor TensorFlow is imported,
and neither is the run the file came from needed.

    hvdcls export runs/pets --format onnx -o pets.onnx
    hvdcls predict pets.onnx photos/ --top-k 3 -o predictions.csv
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from hvdcls.data.batches import EpochBatches
from hvdcls.errors import UserError
from hvdcls.inference.contract import InferenceModel
from hvdcls.inference.images import read_in_workers
from hvdcls.modelcard import ModelCard

# What predict needs of the metadata; model, backend and weights are read when present.
REQUIRED_METADATA = ("class_names", "image_size", "crop_fraction", "mean", "std", "layout")
LAYOUTS = ("NHWC", "NCHW")  # the input's axes; the pipeline's batches are NHWC
PREFERRED_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")


def load(path: Path) -> "OnnxModel":
    """The ONNX file at `path`, ready to run; one-line UserError for a file ONNX Runtime
    cannot load or one without hvdcls's metadata."""
    ort = _onnxruntime()
    try:
        session = ort.InferenceSession(str(path), providers=_providers(ort))
    except Exception as err:  # ONNX Runtime's own exception types, one per failure
        reason = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        raise UserError(f"MODEL {path} is not an ONNX file ONNX Runtime can load ({reason}); MODEL is "
                        "a run directory, a checkpoint directory or an ONNX export") from None
    card, layout = card_from_metadata(session.get_modelmeta().custom_metadata_map, path)
    return OnnxModel(session, card, layout)


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise UserError("an ONNX model needs ONNX Runtime: pip install onnxruntime "
                        "(or onnxruntime-gpu)") from None
    return onnxruntime


def _providers(ort) -> list[str]:
    available = ort.get_available_providers()
    return [name for name in PREFERRED_PROVIDERS if name in available] or available


def card_from_metadata(metadata: dict[str, str], path: Path) -> tuple[ModelCard, str]:
    """The model card and input layout an export's metadata_props hold."""
    missing = [key for key in REQUIRED_METADATA if key not in metadata]
    if missing:
        raise UserError(f"MODEL {path} has no hvdcls metadata ({', '.join(missing)} missing): "
                        "write it with `hvdcls export RUN_DIR --format onnx`")
    try:
        card = ModelCard(backend=metadata.get("backend", "onnx"), model=metadata.get("model", "onnx"),
                         class_names=[str(name) for name in json.loads(metadata["class_names"])],
                         image_size=int(metadata["image_size"]),
                         crop_fraction=float(metadata["crop_fraction"]),
                         mean=[float(v) for v in json.loads(metadata["mean"])],
                         std=[float(v) for v in json.loads(metadata["std"])],
                         weights=metadata.get("weights", "model"))
    except (ValueError, TypeError) as err:
        raise UserError(f"MODEL {path}: unreadable hvdcls metadata ({err})") from None
    layout = metadata["layout"].upper()
    if layout not in LAYOUTS or len(card.mean) != 3 or len(card.std) != 3 or not card.class_names:
        raise UserError(f"MODEL {path}: unusable hvdcls metadata (layout {metadata['layout']!r}, "
                        f"{len(card.mean)} means, {len(card.std)} stds, {card.num_classes} classes)")
    return card, layout


class OnnxModel(InferenceModel):
    """An ONNX Runtime session over NHWC batches (transposed for an NCHW model)."""

    def __init__(self, session: Any, card: ModelCard, layout: str):
        self.session, self.card, self.layout = session, card, layout
        self.input_name = session.get_inputs()[0].name

    def logits(self, images: np.ndarray) -> np.ndarray:
        if self.layout == "NCHW":
            images = images.transpose(0, 3, 1, 2)
        feed = {self.input_name: np.ascontiguousarray(images, np.float32)}
        return np.asarray(self.session.run(None, feed)[0], np.float32)

    def batches(self, batches: EpochBatches, workers: int) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        for images, labels in read_in_workers(batches, workers):
            yield self.logits(images), labels

    def export(self, fmt: str, path: Path, sample: np.ndarray) -> dict:
        raise UserError("an ONNX file is an export already: export from its run directory")
