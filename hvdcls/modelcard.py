"""A model card: what any consumer of a trained model needs besides its weights.

    RUN_DIR/model_card.json   written by rank 0 when a run starts (hvdcls.training.run)

The class names (in the order of the model's outputs), the input the model expects (image
size, the evaluation's centre-crop fraction, the mean and std on RGB pixels in [0, 1]) and how
to build the architecture again (backend, model name, patch size). Evaluation, export and
prediction read it instead of guessing; every export carries it (an ONNX file as
`metadata_props`, see `onnx_metadata`), so ONNX Runtime or a plain torchvision script needs
nothing of hvdcls to use the model.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

from hvdcls.errors import UserError
from hvdcls.files.fileio import write_json_atomic

CARD_FILE = "model_card.json"
FORMAT = 1


@dataclass
class ModelCard:
    backend: str  # torch | tensorflow: whose checkpoint the run holds
    model: str  # model.name, as the backend's build_model takes it
    class_names: list[str]
    image_size: int
    crop_fraction: float  # data.eval_crop: the centre crop's side over the shorter side, before the resize
    mean: list[float]  # RGB, on pixels scaled to [0, 1]
    std: list[float]
    patch_size: Optional[int] = None  # the ViTs' model.patch_size
    weights: str = "model"  # which weights an export or evaluation holds: model | ema
    extra: dict = field(default_factory=dict)  # builder arguments and the like (an export's own)
    format: int = FORMAT

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelCard":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def onnx_metadata(self, layout: str) -> dict[str, str]:
        """An ONNX export's metadata_props: every value a string, lists as JSON."""
        return {"class_names": json.dumps(self.class_names), "image_size": str(self.image_size),
                "crop_fraction": repr(float(self.crop_fraction)), "mean": json.dumps(self.mean),
                "std": json.dumps(self.std), "layout": layout, "model": self.model,
                "backend": self.backend, "weights": self.weights}


def from_config(config, backend: str, class_names: list[str]) -> ModelCard:
    """The card of a run trained with `config` (a hvdcls.config.Config) on `class_names`."""
    data = config.data
    return ModelCard(backend=backend, model=config.model.name, class_names=list(class_names),
                     image_size=data.image_size, crop_fraction=data.eval_crop,
                     mean=[float(v) for v in data.mean], std=[float(v) for v in data.std],
                     patch_size=config.model.patch_size)


def write(run_dir: Path, card: ModelCard) -> None:
    write_json_atomic(Path(run_dir) / CARD_FILE, card.to_dict())


def run_dir_of(path: Path) -> Path:
    """RUN_DIR for RUN_DIR, RUN_DIR/checkpoints or RUN_DIR/checkpoints/epoch-N."""
    path = Path(path)
    if path.name == "checkpoints":
        return path.parent
    if path.parent.name == "checkpoints":
        return path.parent.parent
    return path


def find(path: Path) -> Optional[ModelCard]:
    """The card of the run `path` names (a run directory or one of its checkpoints); None
    when it has none (a run from before cards were written)."""
    card_file = run_dir_of(path) / CARD_FILE
    if not card_file.is_file():
        return None
    try:
        return ModelCard.from_dict(json.loads(card_file.read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise UserError(f"{card_file} is unreadable: {err}") from None


def read(path: Path) -> dict:
    """A card file as written, or one-line UserError."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is unreadable: {err}") from None
