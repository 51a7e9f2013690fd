"""Models for the TensorFlow backend: compact_cnn (see hvdcls/models.py), the ViTs of
hvdcls.models.VIT (tf_backend/vit.py), or keras.applications by name.
Mirror: torch_backend/models.py.
"""
from __future__ import annotations

import inspect

import keras

from hvdcls.errors import UserError
from hvdcls.models import BN_EPSILON, BN_MOMENTUM, COMPACT_CNN, COMPACT_CNN_LAYERS, VIT, Conv, normalise_name, vit_spec
from tf_backend.vit import vision_transformer


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


def build_model(name: str, num_classes: int, image_size: int,
                patch_size: int | None = None) -> keras.Model:
    """An untrained model; an unknown name is a one-line UserError listing examples.
    `patch_size` matters to the ViTs only."""
    if normalise_name(name) == normalise_name(COMPACT_CNN):
        return compact_cnn(num_classes, image_size)
    vit = vit_spec(name)
    if vit is not None:
        return vision_transformer(vit, num_classes, image_size, patch_size, name=normalise_name(name))
    known = application_names()
    if normalise_name(name) not in known:
        raise UserError(f"unknown model {name!r} for the tensorflow backend: use {COMPACT_CNN}, a ViT "
                        f"({', '.join(VIT)}) or a keras.applications model (e.g. resnet50, mobilenet_v2)")
    build = getattr(keras.applications, known[normalise_name(name)])
    options = {"weights": None, "input_shape": (image_size, image_size, 3), "classes": num_classes,
               "classifier_activation": None}  # logits, like torchvision's models
    if "include_preprocessing" in inspect.signature(build).parameters:
        options["include_preprocessing"] = False  # the core normalises already
    try:
        return build(**options)
    except ValueError as err:  # e.g. an input smaller than the model accepts
        raise UserError(f"model {name!r} cannot be built: {str(err).splitlines()[0]}") from None


def count_parameters(model: keras.Model) -> int:
    return int(sum(v.numpy().size for v in model.trainable_variables))
