"""Models for the TensorFlow backend: compact_cnn (see hvdcls/models.py), the ViTs of
hvdcls.models.VIT (tf_backend/vit.py), or keras.applications by name.
Mirror: torch_backend/models.py.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

import keras

from hvdcls.errors import UserError
from hvdcls.models import BN_EPSILON, BN_MOMENTUM, COMPACT_CNN, COMPACT_CNN_LAYERS, VIT, Conv, normalise_name, vit_spec
from tf_backend.vit import EncoderBlock, Tokens, gelu, vision_transformer


def he_normal_fan_out() -> keras.initializers.Initializer:
    """torch's kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, 2 / fan_out).

    One per layer, made after seeding: an initialiser draws its seed from Python's `random`
    when created, so a shared module-level one would fix its seed at import time.
    """
    return keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")


def compact_cnn(num_classes: int, image_size: int) -> keras.Model:
    layers: list = [keras.Input((image_size, image_size, 3))]
    for spec in COMPACT_CNN_LAYERS:
        if isinstance(spec, Conv):
            layers += [keras.layers.Conv2D(spec.filters, 3, padding="same", use_bias=False,
                                           kernel_initializer=he_normal_fan_out()),
                       # Keras' momentum weighs the old statistics: 1 - torch's momentum.
                       keras.layers.BatchNormalization(epsilon=BN_EPSILON, momentum=1 - BN_MOMENTUM),
                       keras.layers.ReLU()]
        else:
            layers.append(keras.layers.MaxPooling2D(spec.size))
    head = keras.layers.Dense(num_classes, kernel_initializer="glorot_uniform",
                              bias_initializer="zeros", dtype="float32")  # logits in float32 under AMP
    return keras.Sequential([*layers, keras.layers.GlobalAveragePooling2D(), head], name=COMPACT_CNN)


def application_names() -> dict[str, str]:
    """keras.applications constructors, keyed by normalised name (ResNet50 -> resnet50)."""
    return {normalise_name(n): n for n in dir(keras.applications)
            if n[0].isupper() and callable(getattr(keras.applications, n))}


def application(name: str) -> Callable[..., keras.Model]:
    """keras.applications' constructor for `name`; an unknown name is a one-line UserError."""
    known = application_names()
    if normalise_name(name) not in known:
        raise UserError(f"unknown model {name!r} for the tensorflow backend: use {COMPACT_CNN}, a ViT "
                        f"({', '.join(VIT)}) or a keras.applications model (e.g. resnet50, mobilenet_v2)")
    return getattr(keras.applications, known[normalise_name(name)])


def raw_pixels(mean: Sequence[float], std: Sequence[float]) -> bool:
    """Whether data.mean and data.std leave the pixels in [0, 255]: what keras.applications'
    "raw" weights (EfficientNet, ConvNeXt, ...) expect (hvdcls.pretrained), the model then
    scaling them itself."""
    return all(abs(m) < 1e-6 for m in mean) and all(abs(s * 255 - 1) < 1e-6 for s in std)


def application_options(build: Callable[..., keras.Model], raw: bool) -> dict:
    """What every application is built with: logits, like torchvision's models, and its own
    input scaling only where it is fed raw pixels (else the core has normalised already)."""
    options: dict[str, Any] = {"classifier_activation": None}
    if "include_preprocessing" in inspect.signature(build).parameters:
        options["include_preprocessing"] = raw
    return options


def build_model(name: str, num_classes: int, image_size: int,
                patch_size: int | None = None, raw: bool = False) -> keras.Model:
    """An untrained model; an unknown name is a one-line UserError listing examples.
    `patch_size` matters to the ViTs only; `raw`: the images come as pixels in [0, 255]
    (`raw_pixels`), which the applications that can scale their own input then do."""
    if normalise_name(name) == normalise_name(COMPACT_CNN):
        return compact_cnn(num_classes, image_size)
    vit = vit_spec(name)
    if vit is not None:
        return vision_transformer(vit, num_classes, image_size, patch_size, name=normalise_name(name))
    build = application(name)
    try:
        return build(weights=None, input_shape=(image_size, image_size, 3), classes=num_classes,
                     **application_options(build, raw))
    except ValueError as err:  # e.g. an input smaller than the model accepts
        raise UserError(f"model {name!r} cannot be built: {str(err).splitlines()[0]}") from None


def imagenet_model(name: str, raw: bool) -> keras.Model:
    """keras.applications' own `name` with its imagenet weights, as keras builds it for them
    (its default input size, 1000 classes): keras reads its file from its cache,
    $KERAS_HOME/models (~/.keras/models), under keras' own file name and checks its hash,
    downloading it where the file is missing and the machine has a network."""
    if vit_spec(name) is not None or normalise_name(name) == normalise_name(COMPACT_CNN):
        raise UserError(f"model.weights=imagenet: keras.applications has no weights for {name}; "
                        "use a keras.applications model, or a file or run for this one")
    build = application(name)
    try:
        return build(weights="imagenet", classes=1000, **application_options(build, raw))
    except Exception as err:  # keras' download failure is a bare Exception
        raise UserError(f"model.weights=imagenet: keras could not load {name}'s imagenet weights from "
                        f"its cache ($KERAS_HOME/models, ~/.keras/models by default) nor download them: "
                        f"{str(err).strip().splitlines()[0]}") from None


def custom_objects() -> dict[str, Any]:
    """The ViT's own layers and activation, for keras.saving.load_model of a .keras file."""
    return {"Tokens": Tokens, "EncoderBlock": EncoderBlock, "gelu": gelu}


def count_parameters(model: keras.Model) -> int:
    return int(sum(math.prod(v.shape) for v in model.trainable_variables))  # shapes: zero=3 frees the storage
