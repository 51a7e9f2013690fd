"""Model names and the architectures both backends build layer for layer.

`compact_cnn` is described here, framework-free, and each backend's `models.py` turns the
same description into layers with the same shapes, initialisers and batch-norm settings, so
the two frameworks can be compared like for like. It suits small images (8x8 and up): two
3x3 conv blocks per stage, two 2x pooling stages, global average pooling, one linear head.

The vision transformers' sizes (`VIT`) are here too: torch builds torchvision's
VisionTransformer from them, TensorFlow its own ViT (tf_backend/vit.py), so the two agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hvdcls.errors import UserError

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


@dataclass(frozen=True)
class ViT:
    """A vision transformer's sizes (Dosovitskiy et al.; torchvision's vit_* builders): a
    patch-embedding conv, a class token, learned position embeddings, `layers` pre-norm
    encoder blocks (multi-head self-attention, then an MLP with GELU), a final LayerNorm and
    a linear head on the class token."""

    patch_size: int  # the architecture's own; model.patch_size overrides it
    hidden: int
    layers: int
    heads: int
    mlp: int


# ti and s: DeiT's sizes (Touvron et al., "Training data-efficient image transformers"; timm's
# vit_tiny/vit_small_patch16), small enough to train on a CPU; torchvision has no builder or
# weights for them. b, l, h: torchvision's builders. g and bigG: Zhai et al., "Scaling Vision Transformers"
# (ViT-g/14 1,011 M and ViT-G/14 1,843 M parameters), named as OpenCLIP names them (its
# "bigG" keeps G apart from g where names are compared without case); torchvision has no
# builder for them, so torch builds its VisionTransformer class with these sizes.
VIT = {"vit_ti_16": ViT(16, 192, 12, 3, 768), "vit_s_16": ViT(16, 384, 12, 6, 1536),
       "vit_b_16": ViT(16, 768, 12, 12, 3072), "vit_l_16": ViT(16, 1024, 24, 16, 4096),
       "vit_h_14": ViT(14, 1280, 32, 16, 5120), "vit_g_14": ViT(14, 1408, 40, 16, 6144),
       "vit_bigg_14": ViT(14, 1664, 48, 16, 8192)}
VIT_LN_EPSILON = 1e-6  # torchvision's, in every LayerNorm of its ViT


def vit_spec(name: str) -> Optional[ViT]:
    """The sizes of a ViT named in VIT (any spelling normalise_name accepts), else None."""
    return {normalise_name(k): v for k, v in VIT.items()}.get(normalise_name(name))


def vit_patches(image_size: int, patch_size: int) -> int:
    """Patches per image; an image the patches do not tile is a one-line UserError."""
    if image_size % patch_size:
        raise UserError(f"config data.image_size={image_size} is not a multiple of the ViT's patch "
                        f"size {patch_size}: change one (model.patch_size sets the patch)")
    return (image_size // patch_size) ** 2


def vit_parameters(spec: ViT, num_classes: int, image_size: int, patch_size: int,
                   channels: int = 3) -> int:
    """Trainable parameters of a ViT, counted from its sizes: both backends' tests hold their
    models to this number (so to each other's)."""
    h = spec.hidden
    embed = channels * patch_size * patch_size * h + h  # the patch conv, with bias
    tokens = h + (vit_patches(image_size, patch_size) + 1) * h  # class token, positions
    block = 2 * (2 * h) + (4 * h * h + 4 * h) + (h * spec.mlp + spec.mlp) + (spec.mlp * h + h)
    return embed + tokens + spec.layers * block + 2 * h + h * num_classes + num_classes
