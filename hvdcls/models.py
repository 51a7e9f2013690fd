"""Model names and the one architecture both backends build layer for layer.

`compact_cnn` is described here, framework-free, and each backend's `models.py` turns the
same description into layers with the same shapes, initialisers and batch-norm settings, so
the two frameworks can be compared like for like. It suits small images (8x8 and up): two
3x3 conv blocks per stage, two 2x pooling stages, global average pooling, one linear head.
"""
from __future__ import annotations

from dataclasses import dataclass

COMPACT_CNN = "compact_cnn"


@dataclass(frozen=True)
class Conv:
    filters: int  # 3x3, stride 1, same padding, no bias; then batch norm and ReLU


@dataclass(frozen=True)
class Pool:
    size: int = 2  # max pooling


COMPACT_CNN_LAYERS = (Conv(32), Conv(32), Pool(), Conv(64), Conv(64), Pool())
# Conv: He-normal over fan_out (untruncated); head: Glorot-uniform weights, zero bias.
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.1  # torch convention (new statistics' weight); Keras takes 1 - this


def normalise_name(name: str) -> str:
    """'ResNet50', 'resnet50' and 'res_net_50' name the same model in both backends."""
    return name.replace("_", "").replace("-", "").lower()


def compact_cnn_parameters(num_classes: int, channels: int = 3) -> int:
    """Trainable parameters of compact_cnn, counted from the description alone (3x3 conv
    weights without bias, batch-norm gamma and beta, the linear head and its bias): both
    backends' tests hold their models to this number."""
    total = 0
    for layer in COMPACT_CNN_LAYERS:
        if isinstance(layer, Conv):
            total += 3 * 3 * channels * layer.filters + 2 * layer.filters
            channels = layer.filters
    return total + channels * num_classes + num_classes
