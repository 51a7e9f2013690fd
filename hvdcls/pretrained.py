"""model.weights: where a model's initial weights come from, and the preprocessing they expect.

    model.weights=none                      random initialisation (the default)
    model.weights=DEFAULT                   torchvision's weight enums (torch): DEFAULT, IMAGENET1K_V2, ...
    model.weights=imagenet                  keras.applications' own (tensorflow)
    model.weights=resnet18.pth              a file: .pth/.pt/.bin/.safetensors (torch); .weights.h5/.keras (tensorflow)
    model.weights=runs/20261206-pets        an hvdcls run directory or checkpoint of the same backend

Framework-free: what the text names (`parse`) and the preprocessing that comes with it
(`preprocessing`). Each backend's `weights.py` reads the weights themselves into its model,
rank 0 reading, before the broadcast that makes every rank start alike.

Preprocessing: torchvision's weights expect ImageNet's mean and std on pixels in [0, 1]
(the config's defaults). keras.applications' `imagenet` weights expect their module's own
convention: `caffe` (BGR, the ImageNet mean subtracted from pixels in [0, 255]), `tf`
(pixels scaled to [-1, 1]), `torch` (ImageNet's mean and std) or `raw` (pixels in [0, 255],
the model scales them itself). hvdcls feeds RGB, normalised as (pixels / 255 - mean) / std, so
each convention is given as the mean and std that produce the same numbers; caffe's channel
order is handled by the TensorFlow backend reversing the first convolution's input channels
once at load, so that every model, and every export, takes RGB.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional

from hvdcls import modelcard
from hvdcls.errors import UserError
from hvdcls.models import normalise_name

NONE = "none"
KERAS_IMAGENET = "imagenet"
TORCH_FILE_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
KERAS_FILE_SUFFIXES = (".h5", ".keras")  # .weights.h5 ends in .h5
FILE_SUFFIXES = TORCH_FILE_SUFFIXES + KERAS_FILE_SUFFIXES

Kind = Literal["none", "framework", "file", "run"]


@dataclass(frozen=True)
class WeightsSource:
    """What model.weights names: nothing, a framework's pretrained weights by name, a file, or
    an hvdcls run (a run directory or one of its checkpoints)."""

    kind: Kind
    value: str  # the name, or the path as given

    @property
    def path(self) -> Path:
        return Path(self.value)

    def describe(self) -> str:
        if self.kind == "none":
            return "random initialisation"
        if self.kind == "framework":
            return f"the framework's pretrained {self.value!r}"
        return f"{'the run' if self.kind == 'run' else 'the file'} {self.value}"


def parse(text: Optional[str]) -> WeightsSource:
    """model.weights as a WeightsSource. A path that looks like a file (a weights suffix, or a
    separator) and does not exist is a one-line UserError; a bare word is a framework name."""
    text = (text or NONE).strip()
    if text.lower() in (NONE, "null", "random", ""):
        return WeightsSource("none", NONE)
    path = Path(text).expanduser()
    if path.is_dir():
        return WeightsSource("run", str(path))
    if path.is_file():
        return WeightsSource("file", str(path))
    if text.lower().endswith(FILE_SUFFIXES) or "/" in text or text.startswith("."):
        raise UserError(f"config model.weights={text}: no such file or directory")
    return WeightsSource("framework", text)


# keras.applications' preprocess_input modes, by normalised constructor name: each module's
# own `preprocess_input` (keras/src/applications/*.py) says which it calls.
KERAS_MODES = {
    **dict.fromkeys(("resnet50", "resnet101", "resnet152", "vgg16", "vgg19"), "caffe"),
    **dict.fromkeys(("mobilenet", "mobilenetv2", "resnet50v2", "resnet101v2", "resnet152v2",
                     "inceptionv3", "inceptionresnetv2", "xception", "nasnetlarge", "nasnetmobile"), "tf"),
    **dict.fromkeys(("densenet121", "densenet169", "densenet201"), "torch"),
}
# Models that scale their own input when built with include_preprocessing (EfficientNet,
# EfficientNetV2, ConvNeXt, MobileNetV3, RegNet): their pretrained weights take raw pixels.
KERAS_RAW_PREFIXES = ("efficientnet", "convnext", "mobilenetv3", "regnet")

IMAGENET_MEAN = [0.485, 0.456, 0.406]  # hvdcls.config.schema's, repeated: config imports us
IMAGENET_STD = [0.229, 0.224, 0.225]
CAFFE_MEAN_RGB = [123.68 / 255, 116.779 / 255, 103.939 / 255]  # keras' BGR means, in RGB order


@dataclass(frozen=True)
class Preprocessing:
    """The normalisation a set of weights was trained with, as data.mean and data.std on RGB
    pixels in [0, 1], and where it comes from (for the first log line)."""

    mean: list[float]
    std: list[float]
    source: str
    bgr: bool = False  # caffe: the TensorFlow backend reverses the first convolution's channels


def keras_mode(model_name: str) -> str:
    """keras.applications' preprocess_input mode for `model_name`'s imagenet weights."""
    name = normalise_name(model_name)
    if name.startswith(KERAS_RAW_PREFIXES):
        return "raw"
    return KERAS_MODES.get(name, "torch")


def keras_preprocessing(model_name: str) -> Preprocessing:
    mode = keras_mode(model_name)
    source = f"keras.applications' {mode!r} preprocessing of {model_name}"
    if mode == "caffe":
        return Preprocessing(CAFFE_MEAN_RGB, [1 / 255] * 3, source, bgr=True)
    if mode == "tf":
        return Preprocessing([0.5] * 3, [0.5] * 3, source)
    if mode == "raw":
        return Preprocessing([0.0] * 3, [1 / 255] * 3, source)
    return Preprocessing(list(IMAGENET_MEAN), list(IMAGENET_STD), source)


def preprocessing(source: WeightsSource, model_name: str) -> Optional[Preprocessing]:
    """The preprocessing `source`'s weights expect, where they say: a framework's pretrained
    weights (by their framework's convention) and an hvdcls run (its model card's); None for no
    weights or a bare file (which says nothing: the config's data.mean and data.std stand)."""
    if source.kind == "framework":
        if source.value.lower() == KERAS_IMAGENET:
            return keras_preprocessing(model_name)
        return Preprocessing(list(IMAGENET_MEAN), list(IMAGENET_STD),
                             f"torchvision's {source.value} weights (ImageNet mean and std)")
    if source.kind == "run":
        found = modelcard.find(source.path)
        if found is not None:
            return Preprocessing(found.mean, found.std, f"the run {source.value}'s model card")
    return None


Share = Callable[[Any, str], Any]  # a backend's broadcast_object: rank 0's value on every rank


def read_on_rank0(load: Callable[[], dict], rank: int, share: Optional[Share]) -> dict:
    """Rank 0 reads the weights (`load`), and its outcome reaches every rank through `share`, a
    UserError included, so that no rank waits in a collective for a rank that stopped. With
    `share` None (elastic mode, where building runs no collective) this rank reads itself."""
    if share is None:
        return load()
    outcome: tuple = ("ok", None)
    if rank == 0:
        try:
            outcome = ("ok", load())
        except UserError as err:
            outcome = ("error", str(err))
    kind, value = share(outcome, "model.weights")  # Horovod: rank 0's outcome on every rank
    if kind == "error":
        raise UserError(value)
    return value



def described(card: modelcard.ModelCard) -> str:
    """A run's model as its card describes it, for error lines."""
    return f"{card.model} with {card.num_classes} classes"


def refuse_changes(report: dict, checkpoint_dir: Path, card: modelcard.ModelCard) -> None:
    """A run's checkpoint loads into the model its card describes as it was saved: a head
    replaced or a grid interpolated (a backend's fit `report`) means the card does not
    describe its checkpoint, a one-line UserError."""
    changed = report["replaced"] + report["interpolated"]
    if changed:
        raise UserError(f"{checkpoint_dir} does not fit {described(card)}: {changed[0]}")
