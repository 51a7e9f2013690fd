"""torch_backend.vit and torch_backend.recompute, in process: the ViTs against the table in
hvdcls.models, and activation checkpointing leaving one step's gradients as they were.

Mirror: tests/tf_backend/test_vit.py (same cases; what TensorFlow refuses, it refuses here too
where torch cannot do it either).
"""
import copy

import pytest
import torch
import torchvision
from torchvision.models.vision_transformer import VisionTransformer

from hvdcls import models as spec
from hvdcls.errors import UserError
from torch_backend import models, recompute

CLASSES = 10
TINY = spec.ViT(patch_size=4, hidden=16, layers=2, heads=2, mlp=32)  # the checkpointing tests'


@pytest.mark.parametrize("name", ["vit_b_16", "vit_l_16", "vit_h_14"])
def test_the_table_is_torchvisions(name):
    """Each builder's model, on the meta device (no memory, no init cost), has the table's
    parameter count: same widths, depths and MLP sizes."""
    size = 2 * spec.VIT[name].patch_size
    with torch.device("meta"):
        built = getattr(torchvision.models, name)(image_size=size)
    assert models.count_parameters(built) == spec.vit_parameters(spec.VIT[name], 1000, size, spec.VIT[name].patch_size)


@pytest.mark.parametrize("name, timm_count", [("vit_ti_16", 5_717_416), ("vit_s_16", 22_050_664)])
def test_the_small_vits_are_deits_sizes(name, timm_count):
    """ViT-Ti/16 and ViT-S/16 (DeiT's sizes, no torchvision builder), built by name at 224 px
    with 1,000 classes: the formula's count, which is timm's vit_tiny/vit_small_patch16_224's."""
    with torch.device("meta"):
        built = models.build_model(name, 1000, image_size=224)
    assert models.count_parameters(built) == spec.vit_parameters(spec.VIT[name], 1000, 224, 16) == timm_count


@pytest.mark.parametrize("name, paper_millions", [("vit_g_14", 1011), ("vit_bigg_14", 1843)])
def test_the_billion_parameter_vits_are_built_to_the_formula_and_the_paper(name, paper_millions):
    """ViT-g/14 and ViT-G/14, which torchvision has no builder for, built by name on the meta
    device at 224 px (nothing of that size allocated): the formula's count, and within 0.2 %
    of Zhai et al.'s table (which rounds, and counts its own head)."""
    with torch.device("meta"):
        built = models.build_model(name, 1000, image_size=224)
    count = models.count_parameters(built)
    assert count == spec.vit_parameters(spec.VIT[name], 1000, 224, 14) and count > 1e9
    assert abs(count / 1e6 - paper_millions) / paper_millions < 0.002


def test_vit_b_16_at_32_px_in_patches_of_8_maps_images_to_logits():
    model = models.build_model("ViT-B-16", CLASSES, image_size=32, patch_size=8)
    assert models.count_parameters(model) == spec.vit_parameters(spec.VIT["vit_b_16"], CLASSES, 32, 8)
    assert model.patch_size == 8 and model.seq_length == 16 + 1
    with torch.no_grad():
        logits = model.eval()(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, CLASSES) and torch.isfinite(logits).all()


def test_an_image_the_patches_do_not_tile_is_a_one_line_user_error():
    with pytest.raises(UserError) as caught:
        models.build_model("vit_b_16", CLASSES, image_size=30, patch_size=8)
    assert "data.image_size=30" in str(caught.value) and "\n" not in str(caught.value)


def one_step_gradients(model, size: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(4, 3, size, size, generator=generator)
    labels = torch.tensor([0, 1, 2, 3])
    model.train()
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def tiny_vit() -> VisionTransformer:
    torch.manual_seed(0)
    model = models.vision_transformer(TINY, CLASSES, image_size=8)
    torch.nn.init.normal_(model.heads.head.weight)  # a zero head would leave every other gradient 0
    return model


@pytest.mark.parametrize("make, size", [(tiny_vit, 8), (lambda: models.build_model("resnet18", CLASSES), 32)],
                         ids=["vit", "resnet18"])
def test_checkpointing_leaves_one_steps_gradients_and_state_as_they_were(make, size):
    plain = make()
    checkpointed = recompute.enable(copy.deepcopy(plain), "test")
    expected, got = one_step_gradients(plain, size), one_step_gradients(checkpointed, size)
    assert list(got) == list(expected)  # same parameter names: checkpoints still load
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
    # Batch norm's running statistics were updated once, not again by the recomputation.
    after, before = checkpointed.state_dict(), plain.state_dict()
    assert list(after) == list(before)
    for name in before:
        assert torch.equal(after[name], before[name]), name


def test_checkpointing_wraps_each_encoder_block_and_each_stage():
    vit = recompute.enable(tiny_vit(), "vit")
    assert isinstance(vit.encoder.layers, recompute.CheckpointedBlocks) and len(vit.encoder.layers) == TINY.layers
    resnet = recompute.enable(models.build_model("resnet18", CLASSES), "resnet18")
    assert all(isinstance(getattr(resnet, stage), recompute.CheckpointedStage) for stage in recompute.RESNET_STAGES)


def test_checkpointing_a_model_it_cannot_serve_is_a_one_line_user_error():
    with pytest.raises(UserError) as caught:
        recompute.enable(models.build_model("compact_cnn", CLASSES), "compact_cnn")
    assert "compact_cnn" in str(caught.value) and "\n" not in str(caught.value)
