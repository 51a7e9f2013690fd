"""The vision transformers for the PyTorch backend: torchvision's VisionTransformer (what its
vit_b_16/vit_l_16/vit_h_14 builders make; ViT-g/14 and ViT-G/14, which it has no builder for,
the same class) with the sizes of hvdcls.models.VIT, random init, at any image and patch size
(the builders fix the patch).

Mirror: tf_backend/vit.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hvdcls.models import ViT, vit_patches

if TYPE_CHECKING:
    from torchvision.models.vision_transformer import VisionTransformer


def vision_transformer(spec: ViT, num_classes: int, image_size: int,
                       patch_size: int | None = None) -> VisionTransformer:
    """An untrained ViT; `patch_size` None: the architecture's own. torchvision's defaults
    otherwise: no dropout, LayerNorm epsilon 1e-6, a zero-initialised head."""
    from torchvision.models.vision_transformer import VisionTransformer

    patch = patch_size or spec.patch_size
    vit_patches(image_size, patch)  # an image the patches do not tile: one line, before torch asserts
    return VisionTransformer(image_size=image_size, patch_size=patch, num_layers=spec.layers,
                             num_heads=spec.heads, hidden_dim=spec.hidden, mlp_dim=spec.mlp,
                             num_classes=num_classes)
