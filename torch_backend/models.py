"""Models for the PyTorch backend: compact_cnn (see hvdcls/models.py), the ViTs of
hvdcls.models.VIT (torch_backend/vit.py), torchvision by name, or timm's as `timm/NAME` (when
timm is installed). torchvision is imported only for the models it builds: it costs every rank
about 0.1 s of start-up, which compact_cnn's runs to a target accuracy need not pay.

Mirror: tf_backend/models.py.
"""
from __future__ import annotations

import torch
from torch import nn

from hvdcls.errors import UserError
from hvdcls.models import BN_EPSILON, BN_MOMENTUM, COMPACT_CNN, COMPACT_CNN_LAYERS, VIT, Conv, normalise_name, vit_spec
from torch_backend.vit import vision_transformer

TIMM_PREFIX = "timm/"  # model.name=timm/NAME: timm.create_model(NAME)


def compact_cnn(num_classes: int) -> nn.Module:
    layers: list[nn.Module] = []
    channels = 3
    for spec in COMPACT_CNN_LAYERS:
        if isinstance(spec, Conv):
            conv = nn.Conv2d(channels, spec.filters, 3, padding=1, bias=False)
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            layers += [conv, nn.BatchNorm2d(spec.filters, eps=BN_EPSILON, momentum=BN_MOMENTUM),
                       nn.ReLU(inplace=True)]
            channels = spec.filters
        else:
            layers.append(nn.MaxPool2d(spec.size))
    head = nn.Linear(channels, num_classes)
    nn.init.xavier_uniform_(head.weight)
    nn.init.zeros_(head.bias)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), head)


def torchvision_names() -> dict[str, str]:
    """Classification models torchvision builds by name, keyed by normalised name."""
    import torchvision

    return {normalise_name(n): n for n in torchvision.models.list_models(module=torchvision.models)}


def build_model(name: str, num_classes: int, image_size: int = 224,
                patch_size: int | None = None) -> nn.Module:
    """An untrained model; an unknown name is a one-line UserError listing examples. The image
    size matters to the ViTs only (their position embeddings), as does `patch_size`."""
    if normalise_name(name) == normalise_name(COMPACT_CNN):
        return compact_cnn(num_classes)
    if name.startswith(TIMM_PREFIX):
        return timm_model(name[len(TIMM_PREFIX):], num_classes)
    vit = vit_spec(name)
    if vit is not None:
        return vision_transformer(vit, num_classes, image_size, patch_size)
    import torchvision

    known = torchvision_names()
    if normalise_name(name) not in known:
        raise UserError(f"unknown model {name!r} for the torch backend: use {COMPACT_CNN}, a ViT "
                        f"({', '.join(VIT)}) or a torchvision classification model (e.g. resnet18, resnet50)")
    return torchvision.models.get_model(known[normalise_name(name)], weights=None,
                                        num_classes=num_classes)


def timm_model(name: str, num_classes: int) -> nn.Module:
    """timm's model `name`, untrained (timm's own initialisation), with `num_classes` outputs.
    Its input size is the model's own: timm's ViTs take the size they were defined for."""
    try:
        import timm
    except ImportError:
        raise UserError(f"model.name={TIMM_PREFIX}{name} needs timm: pip install timm") from None
    if not timm.is_model(name):
        raise UserError(f"unknown timm model {name!r} (timm.list_models() names them, e.g. resnet18, "
                        "convnext_atto)")
    return timm.create_model(name, pretrained=False, num_classes=num_classes)


def convert_sync_batchnorm(module: nn.Module, sync_bn_class) -> nn.Module:
    """Replace every BatchNorm2d by `sync_bn_class` (torch_backend.sync_bn), keeping its state."""
    if isinstance(module, nn.BatchNorm2d):
        sync = sync_bn_class(module.num_features, eps=module.eps, momentum=module.momentum,
                             affine=module.affine, track_running_stats=module.track_running_stats)
        sync.load_state_dict(module.state_dict())
        return sync
    for name, child in module.named_children():
        setattr(module, name, convert_sync_batchnorm(child, sync_bn_class))
    return module


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def to_channels_first(images: torch.Tensor) -> torch.Tensor:
    """The core hands out NHWC (numpy's and Keras' layout); torch convolutions want NCHW."""
    return images.permute(0, 3, 1, 2).contiguous()
