"""model.weights for the TensorFlow backend: a model's initial weights from keras.applications'
imagenet weights, a Keras file or an hvdcls run (hvdcls.pretrained says which), fitted to the
model built.

    model.weights=imagenet           keras' own constructor with weights="imagenet": its file
                                     from keras' cache ($KERAS_HOME/models), hash checked
    model.weights=m.weights.h5       Keras' weights file (or a legacy .h5), read by keras into
                                     the configured architecture at the file's class count
    model.weights=m.keras            a whole Keras model (keras.saving.load_model)
    model.weights=runs/pets          a tensorflow run's newest checkpoint (its EMA when it kept one)

Each source becomes a Keras model's variables in order (`model.variables`, the order the
checkpoints' `model/<i>` keep), set beside the model's own by position. Every variable must get
one of its shape, except the classifier head (the last Dense layer, left as initialised when
the class count differs) and our ViT's position embedding of another grid (interpolated).
Anything else that does not fit is a one-line UserError naming the variable and both shapes.
Rank 0 reads and loads; the backend's broadcast makes the other ranks alike.

keras.applications' imagenet weights come with their conventions (hvdcls.pretrained): caffe's
models (ResNet50 v1, VGG) were trained on BGR, so the first convolution's input channels are
reversed once here and the model takes RGB like every other; EfficientNet (V1) keeps its
standard deviation where its Normalization layer reads a variance, which keras corrects with a
Rescaling layer only when it loads the weights itself (`efficientnet_variance`).

Mirror: torch_backend/weights.py.
"""
from __future__ import annotations

import math
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import h5py
import keras
import numpy as np
import tensorflow as tf

from hvdcls import pretrained
from hvdcls.errors import UserError
from hvdcls.inference.run import open_run
from hvdcls.models import normalise_name
from tf_backend import consolidate, models
from tf_backend.vit import Tokens

if TYPE_CHECKING:
    from hvdcls.config import Config
    from hvdcls.inference.run import RunModel

CHECKPOINT_FILE = "tensorflow.npz"  # what TensorFlowBackend.save writes into a checkpoint directory
# keras' efficientnet.IMAGENET_STDDEV_RGB: what its model built for imagenet divides by once more
EFFICIENTNET_STD = pretrained.IMAGENET_STD


@dataclass
class Arrays:
    """A weights source as a Keras model's variables in order: each one's shape, and how to read it."""

    shapes: list[tuple[int, ...]]
    read: Callable[[int], np.ndarray]
    origin: str  # for error lines: "model.weights=m.keras"


@dataclass
class Fit:
    """How a source's arrays go into a model, by position: copied, or interpolated to a grid."""

    copied: list[int] = field(default_factory=list)
    interpolated: dict[int, int] = field(default_factory=dict)  # position -> the model's grid side
    report: dict[str, list[str]] = field(default_factory=lambda: {"replaced": [], "interpolated": []})


def load_initial_weights(model: keras.Model, config: Config, rank: int = 0,
                         share: Optional[pretrained.Share] = None) -> dict:
    """Read model.weights into `model` (just built for `config`). `share` (the backend's
    broadcast_object): rank 0 alone reads, and its outcome reaches every rank, a UserError
    included, so no rank waits in a collective; None (elastic mode, where build runs no
    collective): this rank reads itself. Returns model_info's "weights": {"source",
    "replaced", "interpolated"} (what the banner prints)."""
    source = pretrained.parse(config.model.weights)
    if source.kind == "none":
        return {"source": source.describe(), "replaced": [], "interpolated": []}

    def load() -> dict:
        return {"source": source.describe(), **load_weights(model, source, config)}

    return pretrained.read_on_rank0(load, rank, share)


def load_weights(model: keras.Model, source: pretrained.WeightsSource, config: Config) -> dict:
    """`source`'s arrays fitted into `model`; returns {"replaced", "interpolated"}."""
    arrays = read_source(source, config, model)
    fit = match(model, arrays, config.model.name)
    copy_in(model, arrays, fit)
    if source.kind == "framework":
        follow_keras_conventions(model, config.model.name)
    return fit.report


def read_source(source: pretrained.WeightsSource, config: Config, model: keras.Model) -> Arrays:
    """`source`'s arrays, in the order of a Keras model's variables (`model`: the one built)."""
    if source.kind == "framework":
        if source.value.lower() != pretrained.KERAS_IMAGENET:
            raise UserError(f"model.weights={source.value}: the tensorflow backend's pretrained weights are "
                            f"keras.applications' {pretrained.KERAS_IMAGENET!r}")
        return of_model(models.imagenet_model(config.model.name, raw_pixels(config)),
                        f"model.weights={source.value}")
    if source.kind == "run":
        return read_run_arrays(open_run(source.path, "model.weights"), f"model.weights={source.value}")
    if source.path.suffix == ".npz":  # tensorflow.npz's layout: hvdcls checkpoint consolidate's file
        return npz_arrays(source.path, f"model.weights={source.value}")
    return of_model(read_file(source.path, config, head_layer(model)), f"model.weights={source.value}")


def raw_pixels(config: Config) -> bool:
    return models.raw_pixels(config.data.mean, config.data.std)


def of_model(model: keras.Model, origin: str) -> Arrays:
    variables = model.variables
    return Arrays([tuple(v.shape) for v in variables], lambda i: np.asarray(variables[i].numpy()), origin)


def in_memory(values: list[np.ndarray], origin: str) -> Arrays:
    return Arrays([tuple(a.shape) for a in values], values.__getitem__, origin)


def read_file(path: Path, config: Config, head: keras.layers.Layer) -> keras.Model:
    """A Keras file as a model: a .keras file is one whole; a weights file is read by keras into
    the configured architecture, built at the class count of the file's head (`head`: the
    model's; its class count where the file's cannot be told)."""
    try:
        if path.name.endswith(".keras"):
            return keras.saving.load_model(path, custom_objects=models.custom_objects(), compile=False)
        model = models.build_model(config.model.name, head_classes(path, head) or classes(head), config.data.image_size,
                                   config.model.patch_size, raw_pixels(config))
        with warnings.catch_warnings():  # a file of another architecture: one per layer it lacks
            warnings.filterwarnings("ignore", "Skipping nested container", UserWarning)
            model.load_weights(path)
        return model
    except (ValueError, OSError, KeyError, TypeError, zipfile.BadZipFile) as err:
        raise UserError(f"model.weights={path} does not fit {config.model.name}: {keras_reason(err)}") from None


def keras_reason(err: BaseException) -> str:
    """Why keras could not load a file, on one line: its first failure (it lists them all, with
    the values of the variable concerned), said as `match` says it where it is a shape."""
    text = str(err).strip()
    if text.startswith("A total of") and "\n\n" in text:  # "... Example error message for <layer>:"
        text = text.split("\n\n")[1].strip()
    shapes = re.search(r"variable\.shape=(\(.*?\)), Received: value\.shape=(\(.*?\))", text)
    variable = re.search(r"Target variable: <Variable path=([^,>]+)", text)
    if shapes and variable:
        return f"{variable.group(1)} is {shapes.group(2)} there, {shapes.group(1)} in the model"
    return (text.splitlines() or [type(err).__name__])[0]


def head_classes(path: Path, head: keras.layers.Layer) -> Optional[int]:
    """The class count of a Keras weights file's head, a layer of the kind of `head` (Dense or
    Conv2D): the last with weights in a legacy .h5, which lists its layers in order
    (`layer_names`); in Keras 3's .weights.h5, which keeps each under layers/<its class in snake
    case, numbered in order>/vars, the last of `head`'s class. None: it cannot be told."""
    kind = "dense" if isinstance(head, keras.layers.Dense) else "conv2d"
    try:
        with h5py.File(path, "r") as f:
            if "layer_names" in f.attrs:
                names = [n for n in f.attrs["layer_names"] if len(f[n].attrs["weight_names"])]
                group = f[names[-1]]
                kernel = group[group.attrs["weight_names"][0]]
            else:
                numbered = [k for k in f["layers"] if k == kind or k.startswith(kind + "_")]
                last = max(numbered, key=lambda k: int(k.removeprefix(kind).lstrip("_") or 0))
                kernel = f[f"layers/{last}/vars/0"]
            return int(kernel.shape[-1])
    except (OSError, KeyError, ValueError):  # not HDF5, another layout, no such layer
        return None


def read_run_arrays(run: RunModel, origin: str) -> Arrays:
    """read_run_weights' arrays; a training.zero=3 checkpoint's sharded variables read one at a
    time from its ranks' shard files (tf_backend/consolidate.py)."""
    check_backend(run)
    path = run.checkpoint_dir / CHECKPOINT_FILE
    from_shards = consolidate.sharded_model(run.checkpoint_dir, path, str(path))
    if from_shards is not None:
        return Arrays(from_shards.shapes, from_shards.read, origin)
    return in_memory(read_run_weights(run), origin)


def npz_arrays(path: Path, origin: str) -> Arrays:
    """An .npz of tensorflow.npz's `model/<i>` arrays, read one at a time."""
    try:
        stored = np.load(path)
        shapes = consolidate.model_shapes(stored)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"{origin}: unreadable: {first_line(err)}") from None
    if not shapes:
        raise UserError(f"{origin}: holds no model/<i> arrays (tensorflow.npz's layout)")
    return Arrays(shapes, lambda i: stored[f"model/{i}"], origin)


def check_backend(run: RunModel) -> None:
    if run.backend != "tensorflow":
        raise UserError(f"{run.run_dir} was trained by the {run.backend} backend; the tensorflow backend "
                        f"reads tensorflow runs (export it, or train with --backend {run.backend})")


def read_run_weights(run: RunModel) -> list[np.ndarray]:
    """The model variables of an hvdcls run's checkpoint (tensorflow.npz's model/<i>, by the
    position of model.variables), its floating ones taken from ema/<j> in order when the run's
    card says the EMA's weights are the ones to use. Another backend's run is a one-line UserError."""
    check_backend(run)
    path = run.checkpoint_dir / CHECKPOINT_FILE
    try:
        with np.load(path) as stored:
            model, ema = numbered(stored, "model"), numbered(stored, "ema")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None
    if not (run.use_ema and ema):
        return model
    floating = [i for i, value in enumerate(model) if value.dtype.kind == "f"]  # what the EMA keeps
    if len(floating) != len(ema):
        raise UserError(f"cannot read {path}: {len(ema)} EMA arrays for {len(floating)} floating variables")
    for i, average in zip(floating, ema):
        model[i] = average
    return model


def numbered(stored: Any, prefix: str) -> list[np.ndarray]:
    """stored[prefix/0], stored[prefix/1], ... while they exist."""
    count = sum(key.startswith(prefix + "/") for key in stored.files)
    return [stored[f"{prefix}/{i}"] for i in range(count)]


def match(model: keras.Model, arrays: Arrays, model_name: str) -> Fit:
    """Which of the source's arrays go where; the first that does not fit is a UserError."""
    variables, heads, positions = model.variables, head_variables(model), position_variables(model)
    fit = Fit()
    for i, variable in enumerate(variables):
        shape = tuple(variable.shape)
        theirs = arrays.shapes[i] if i < len(arrays.shapes) else None
        if not place(fit, i, shape, theirs, heads.get(variable.path), variable.path in positions):
            what = (f"it ends before {variable.path} {shape}" if theirs is None
                    else f"{variable.path} is {theirs} there, {shape} in the model")
            raise UserError(f"{arrays.origin} does not fit {model_name}: {what} "
                            f"({len(arrays.shapes)} variables there, {len(variables)} in the model)")
    if len(arrays.shapes) > len(variables):
        raise UserError(f"{arrays.origin} does not fit {model_name}: it has {len(arrays.shapes)} variables, "
                        f"the model {len(variables)}")
    return fit


def place(fit: Fit, i: int, shape: tuple[int, ...], theirs: Optional[tuple[int, ...]],
          head: Optional[str], position_embedding: bool) -> bool:
    """Note in `fit` how the source's array `i` (shape `theirs`, None: absent) fills the
    model's variable of `shape` (of the head layer named `head`, or a position embedding);
    False when it cannot."""
    if theirs == shape:
        fit.copied.append(i)
        return True
    if theirs is None:
        return False
    if head is not None and theirs[:-1] == shape[:-1]:  # another class count: left as initialised
        note = f"{head}: {theirs[-1]} -> {shape[-1]} classes"
        if note not in fit.report["replaced"]:
            fit.report["replaced"].append(note)
        return True
    old, new = grid_side(theirs, shape[-1]), grid_side(shape, shape[-1])
    if position_embedding and old and new:
        fit.interpolated[i] = new
        fit.report["interpolated"].append(f"positions: {old}x{old} -> {new}x{new} patches")
        return True
    return False


def head_layer(model: keras.Model) -> keras.layers.Layer:
    """The classifier head: the model's last Dense or Conv2D layer (a Dense, but MobileNetV3's
    is the 1x1 convolution `Logits`)."""
    return [layer for layer in model.layers if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D))][-1]


def head_variables(model: keras.Model) -> dict[str, str]:
    """The head's variables: path -> the layer's name."""
    head = head_layer(model)
    return {v.path: head.name for v in head.variables}


def classes(head: keras.layers.Layer) -> int:
    return int(head.kernel.shape[-1])


def position_variables(model: keras.Model) -> set[str]:
    """The paths of our ViT's position embeddings (tf_backend/vit.py's Tokens layer)."""
    return {layer.positions.path for layer in model.layers if isinstance(layer, Tokens)}


def grid_side(shape: tuple[int, ...], width: int) -> int:
    """n for a position embedding (1, 1 + n*n, width); 0 for any other shape."""
    if len(shape) != 3 or shape[0] != 1 or shape[2] != width:
        return 0
    side = math.isqrt(shape[1] - 1)
    return side if side * side == shape[1] - 1 and side > 0 else 0


def interpolate_positions(embedding: np.ndarray, side: int) -> np.ndarray:
    """A ViT's position embedding (1, 1 + m*m, D) resampled to (1, 1 + side*side, D): the
    class token's kept, the m x m grid's bicubically resized as an image of D channels."""
    width, old = embedding.shape[-1], grid_side(tuple(embedding.shape), embedding.shape[-1])
    grid = embedding[:, 1:].astype(np.float32).reshape(1, old, old, width)
    # antialias: a grid made much smaller (224 -> 32 px images) averages rather than samples
    grid = tf.image.resize(grid, (side, side), method="bicubic", antialias=side < old).numpy()
    grid = grid.reshape(1, side * side, width).astype(embedding.dtype)
    return np.concatenate([embedding[:, :1], grid], axis=1)


def copy_in(model: keras.Model, arrays: Arrays, fit: Fit) -> None:
    """Each fitting array read and assigned to the model's variable at its position."""
    variables = model.variables
    for i in fit.copied:
        variables[i].assign(arrays.read(i))
    for i, side in fit.interpolated.items():
        variables[i].assign(interpolate_positions(arrays.read(i), side))
    refresh_normalization(model)


def refresh_normalization(model: keras.Model) -> None:
    """Keras' Normalization layer reads its mean and variance variables once, when built (EfficientNet's
    stem): after they are set (loaded, broadcast, cloned), it must read them again."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.Normalization):
            layer.finalize_state()


def load_run(model: keras.Model, run: RunModel) -> None:
    """The run's checkpoint into `model`, built as its card says: every variable as it was."""
    arrays = read_run_arrays(run, str(run.checkpoint_dir))
    fit = match(model, arrays, pretrained.described(run.card))
    pretrained.refuse_changes(fit.report, run.checkpoint_dir, run.card)
    copy_in(model, arrays, fit)


def follow_keras_conventions(model: keras.Model, model_name: str) -> None:
    """What keras.applications' imagenet weights need beyond their values (module docstring)."""
    if pretrained.keras_mode(model_name) == "caffe":
        take_rgb(model)
    if normalise_name(model_name).startswith("efficientnetb"):
        efficientnet_variance(model)


def take_rgb(model: keras.Model) -> None:
    """Reverse the input channels of the first convolution: weights trained on BGR, fed RGB."""
    first = next(layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    first.kernel.assign(np.asarray(first.kernel.numpy())[:, :, ::-1, :])


def efficientnet_variance(model: keras.Model) -> None:
    """EfficientNet's imagenet file holds the standard deviation as the Normalization layer's
    variance, and keras divides by sqrt(std) once more when it loads the weights itself; a
    variance of variance x std computes the same (x - mean) / std without that layer."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.Normalization) and layer.input_mean is None:
            std = np.asarray(EFFICIENTNET_STD, np.float32)
            layer.adapt_variance.assign(np.asarray(layer.adapt_variance.numpy()) * std)
    refresh_normalization(model)


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
