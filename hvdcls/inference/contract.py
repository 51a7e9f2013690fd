"""The contract between the inference commands and a backend's `inference.py`.

A backend module `<package>.inference` (torch_backend/inference.py, tf_backend/inference.py)
provides:

    load(run: hvdcls.inference.run.RunModel, device: str = "auto") -> InferenceModel
    EXPORT_FORMATS: tuple[str, ...]   the formats `export` takes, the first the default

and is reached by name through `hvdcls.registry.load(backend, "inference")`, so the core never
imports a framework. Images cross the boundary as numpy arrays, NHWC float32, already
normalised by the card's mean and std (hvdcls.data.transforms.Preprocess.eval); logits come
back as numpy float32 (N, classes).
"""
from __future__ import annotations

import abc
from pathlib import Path
from typing import Iterable

import numpy as np

from hvdcls.data.batches import EpochBatches
from hvdcls.errors import UserError
from hvdcls.modelcard import ModelCard

# A format whose output is a directory rather than one file.
DIRECTORY_FORMATS = ("savedmodel",)
# What an export's outputs may differ by from the framework's, on the same batch.
EXPORT_TOLERANCE = 1e-4


class InferenceModel(abc.ABC):
    """A trained model in evaluation mode, its weights as the card says (the EMA's or the
    model's), on one device, in one process."""

    card: ModelCard

    @abc.abstractmethod
    def logits(self, images: np.ndarray) -> np.ndarray:
        """(N, H, W, 3) float32 normalised -> (N, classes) float32, in inference mode."""

    @abc.abstractmethod
    def batches(self, batches: EpochBatches, workers: int) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """(logits, labels) as numpy for each batch of `batches`, in order, read by the
        framework's own loader with `workers` worker processes (0: in this process) and run
        through the model: the fast path of evaluate and predict."""

    @abc.abstractmethod
    def export(self, fmt: str, path: Path, sample: np.ndarray) -> dict:
        """Write the model in format `fmt` at `path` (a file; a directory for DIRECTORY_FORMATS;
        the caller renames it into place), carrying the card (class names and preprocessing),
        then load what was written and compare its outputs with `self.logits(sample)`: a
        difference above EXPORT_TOLERANCE is a UserError naming it. Returns what summarises the
        export for its report: {"format", "max_abs_diff", "layout", ...}."""


def check_export(fmt: str, expected: np.ndarray, outputs: np.ndarray) -> dict:
    """An export's outputs against the model's on the same batch: {"max_abs_diff"}, or a
    UserError naming the difference above EXPORT_TOLERANCE (a NaN fails too)."""
    if outputs.shape != expected.shape:
        raise UserError(f"the {fmt} export gives outputs of shape {outputs.shape}, the model {expected.shape}")
    diff = float(np.max(np.abs(outputs.astype(np.float64) - expected))) if expected.size else 0.0
    if not diff <= EXPORT_TOLERANCE:
        raise UserError(f"the {fmt} export's outputs differ from the model's by {diff:.3g} "
                        f"(tolerance {EXPORT_TOLERANCE:g})")
    return {"max_abs_diff": diff}
