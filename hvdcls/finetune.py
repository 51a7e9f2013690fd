"""Fine-tuning's rules, framework-free: which epochs train the head alone
(training.freeze_epochs), each parameter's learning-rate multiplier (optimizer.layer_decay) and
the loss's class weights (training.class_weights).

The backends only name their parameters, in the model's order, and say which are the head's
(torch_backend/finetune.py, tf_backend/finetune.py, through their weights modules' head
finders); the depth of each parameter and its multiplier are decided here, the same way for
both frameworks:

- a ViT (torchvision's and ours: `encoder_layer_N`; timm's: `blocks.N`): the patch embedding,
  the class token and the positions at the bottom, one depth per encoder block above them;
- a ResNet (torch's `layerN`, Keras' `convN_blockM`): the stem at the bottom, one depth per stage;
- compact_cnn: one depth per conv block (its conv and batch norm, hvdcls.models' description);
- any other model: one depth per top-level child (a name's first component), in order.

The head is the top. A parameter after the last block that is not the head's (a ViT's final
LayerNorm, ResNetV2's post_bn) trains with the head, as BEiT's and timm's fine-tuning do; one
before the first block sits at the bottom. With decay d and top depth T, depth k's rate is
lr x d^(T - k): the head's is lr, the block below it lr x d, and so on down.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

from hvdcls.models import COMPACT_CNN, COMPACT_CNN_LAYERS, Conv, normalise_name

# A block's number in a parameter's name; the first pattern any name matches is the model's.
BLOCK_PATTERNS = (
    re.compile(r"(?:^|[./])encoder_layer_(\d+)[./]"),  # torchvision's ViT, tf_backend/vit.py's
    re.compile(r"^blocks\.(\d+)\."),  # timm's ViTs
    re.compile(r"^layer(\d+)\."),  # torchvision's (and timm's) ResNets: the stages layer1..layer4
    re.compile(r"^conv(\d+)_block"),  # keras.applications' ResNets: conv2_block1_... .. conv5_...
)
# compact_cnn's parameters per conv block: the conv's kernel (no bias), batch norm's scale, shift
COMPACT_CNN_BLOCK = 3


def frozen_at(freeze_epochs: int, epoch: int) -> bool:
    """Whether epoch `epoch` (0-based) trains the head alone."""
    return epoch < freeze_epochs


def decay_in_force(decay: Optional[float]) -> bool:
    """optimizer.layer_decay: None and 1.0 are off."""
    return decay is not None and decay != 1.0


def block_depths(names: Sequence[str], heads: Sequence[bool], model_name: str) -> list[int]:
    """Each parameter's depth, 0 the bottom; the head's is the top (one above the highest block)."""
    if normalise_name(model_name) == normalise_name(COMPACT_CNN):
        blocks = compact_cnn_blocks(len(names))
    else:
        blocks = named_blocks(names)
    depths = numbered(blocks, heads)
    top = max((d for d, head in zip(depths, heads) if not head and d is not None), default=-1) + 1
    return [top if head or d is None else d for d, head in zip(depths, heads)]


def layer_scales(names: Sequence[str], heads: Sequence[bool], model_name: str,
                 decay: Optional[float]) -> list[float]:
    """Each parameter's learning-rate multiplier: decay^(top - depth), 1.0 for all when off."""
    if not decay_in_force(decay):
        return [1.0] * len(names)
    assert decay is not None
    depths = block_depths(names, heads, model_name)
    top = max(depths, default=0)
    return [float(decay ** (top - d)) for d in depths]


def compact_cnn_blocks(count: int) -> list[Optional[str]]:
    """compact_cnn's parameters in order (the two frameworks build them alike): each conv
    block's kernel, batch-norm scale and shift, then the head's two."""
    convs = sum(isinstance(layer, Conv) for layer in COMPACT_CNN_LAYERS)
    if count != COMPACT_CNN_BLOCK * convs + 2:
        raise ValueError(f"compact_cnn has {COMPACT_CNN_BLOCK * convs + 2} parameters, not {count}")
    return [f"conv{i // COMPACT_CNN_BLOCK}" if i < COMPACT_CNN_BLOCK * convs else None
            for i in range(count)]


def named_blocks(names: Sequence[str]) -> list[Optional[str]]:
    """Each name's block by the first of BLOCK_PATTERNS the model's names match: before the
    first block "bottom", after the last None (the top); no pattern: the top-level child."""
    for pattern in BLOCK_PATTERNS:
        found = [pattern.search(name) for name in names]
        if any(found):
            break
    else:
        return [re.split(r"[./]", name, maxsplit=1)[0] for name in names]
    matched = [i for i, m in enumerate(found) if m]
    return [f"block{int(m.group(1)):06d}" if m else "bottom" if i < matched[0] else None
            for i, m in enumerate(found)]


def numbered(blocks: Sequence[Optional[str]], heads: Sequence[bool]) -> list[Optional[int]]:
    """Blocks numbered in order of first appearance (the head's and None left unnumbered)."""
    order: dict[str, int] = {}
    for block, head in zip(blocks, heads):
        if block is not None and not head:
            order.setdefault(block, len(order))
    return [None if block is None or head else order[block] for block, head in zip(blocks, heads)]


def class_weights(labels: np.ndarray, num_classes: int) -> list[float]:
    """training.class_weights=auto: n_samples / (n_classes x count_c) per class (sklearn's
    "balanced"); a class without a training sample gets 0 (no sample of it to weigh)."""
    counts = np.bincount(np.asarray(labels, np.int64), minlength=num_classes)[:num_classes]
    weights = np.zeros(num_classes, np.float64)
    present = counts > 0
    weights[present] = len(labels) / (num_classes * counts[present])
    return [float(w) for w in weights]
