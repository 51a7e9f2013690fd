"""hvdcls.finetune, framework-free: the depths and rate multipliers of layer decay on both
frameworks' parameter names, the class weights, the config keys and what they refuse, and the
fine-tuning recipe configs/finetune.yaml."""
from pathlib import Path

import numpy as np
import pytest

from hvdcls import config, finetune
from hvdcls.errors import UserError

REPO = Path(__file__).resolve().parents[2]

# torchvision's resnet18 and keras.applications' ResNet50, cut to one parameter per block kind
TORCH_RESNET = ["conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer1.1.bn2.bias", "layer2.0.conv1.weight",
                "layer3.0.downsample.0.weight", "layer4.1.bn2.bias", "fc.weight", "fc.bias"]
KERAS_RESNET = ["conv1_conv/kernel", "conv1_bn/gamma", "conv2_block1_1_conv/kernel", "conv2_block3_3_bn/beta",
                "conv3_block1_0_conv/kernel", "conv4_block6_3_bn/beta", "conv5_block3_3_bn/beta",
                "predictions/kernel", "predictions/bias"]
RESNET_DEPTHS = [0, 0, 1, 1, 2, 3, 4, 5, 5]
# torchvision's ViT with 3 blocks; tf_backend/vit.py's names; timm's
TORCH_VIT = ["class_token", "conv_proj.weight", "conv_proj.bias", "encoder.pos_embedding",
             "encoder.layers.encoder_layer_0.ln_1.weight", "encoder.layers.encoder_layer_1.mlp.0.weight",
             "encoder.layers.encoder_layer_2.mlp.3.bias", "encoder.ln.weight", "heads.head.weight", "heads.head.bias"]
KERAS_VIT = ["conv_proj/kernel", "conv_proj/bias", "tokens/class_token", "tokens/pos_embedding",
             "encoder_layer_0/ln_1/gamma", "encoder_layer_1/mlp_1/kernel", "encoder_layer_2/mlp_2/bias",
             "ln/gamma", "head/kernel", "head/bias"]
TIMM_VIT = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "blocks.0.norm1.weight",
            "blocks.1.attn.qkv.weight", "blocks.2.mlp.fc2.bias", "norm.weight", "head.weight", "head.bias"]
VIT_DEPTHS = [0, 0, 0, 0, 1, 2, 3, 4, 4, 4]  # the final LayerNorm trains with the head


def heads_last(names: list[str], count: int = 2) -> list[bool]:
    return [i >= len(names) - count for i in range(len(names))]


@pytest.mark.parametrize("names, depths", [(TORCH_RESNET, RESNET_DEPTHS), (KERAS_RESNET, RESNET_DEPTHS),
                                           (TORCH_VIT, VIT_DEPTHS), (KERAS_VIT, VIT_DEPTHS), (TIMM_VIT, VIT_DEPTHS)],
                         ids=["torch-resnet", "keras-resnet", "torch-vit", "keras-vit", "timm-vit"])
def test_both_frameworks_names_give_the_same_depths(names, depths):
    assert finetune.block_depths(names, heads_last(names), "a_model") == depths


def test_compact_cnn_has_one_depth_per_conv_block_in_either_framework():
    torch_names = [f"{i}.w" for i in range(14)]  # conv kernel, BN scale, BN shift x 4, head x 2
    keras_names = [f"compact_cnn/v{i}" for i in range(14)]
    expected = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4]
    for names in (torch_names, keras_names):
        assert finetune.block_depths(names, heads_last(names), "compact_cnn") == expected
    with pytest.raises(ValueError):
        finetune.block_depths(torch_names[:5], heads_last(torch_names[:5]), "CompactCNN")


def test_any_other_model_has_one_depth_per_top_level_child_in_order():
    names = ["features.0.0.weight", "features.1.0.block.weight", "avgpool_none.x", "classifier.1.weight",
             "classifier.1.bias"]
    assert finetune.block_depths(names, heads_last(names), "efficientnet_b0") == [0, 0, 1, 2, 2]
    # the head is the top wherever it sits, and a head-only model is all top
    assert finetune.block_depths(["head.w", "body.w"], [True, False], "m") == [1, 0]
    assert finetune.block_depths(["fc.w"], [True], "m") == [0]


def test_the_head_trains_at_the_rate_and_each_block_below_at_decay_times_the_one_above():
    scales = finetune.layer_scales(TORCH_RESNET, heads_last(TORCH_RESNET), "resnet18", 0.5)
    assert scales == [1 / 32, 1 / 32, 1 / 16, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 1.0]
    for off in (None, 1.0):
        assert finetune.layer_scales(TORCH_RESNET, heads_last(TORCH_RESNET), "resnet18", off) == [1.0] * 9
        assert not finetune.decay_in_force(off)


def test_frozen_epochs_are_the_first_ones():
    assert [finetune.frozen_at(2, epoch) for epoch in range(4)] == [True, True, False, False]
    assert not finetune.frozen_at(0, 0)


def test_class_weights_are_sklearns_balanced_and_zero_for_an_absent_class():
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2])  # 6, 2, 4 of 12; class 3 absent
    weights = finetune.class_weights(labels, 4)
    assert weights == pytest.approx([12 / (4 * 6), 12 / (4 * 2), 12 / (4 * 4), 0.0])
    # every present sample weighs the same in total: n_samples / n_classes per class
    counts = np.bincount(labels, minlength=4)
    assert counts[:3] * np.array(weights[:3]) == pytest.approx([3.0, 3.0, 3.0])


def user_error(*overrides: str) -> str:
    with pytest.raises(UserError) as info:
        config.load(overrides=list(overrides))
    assert "\n" not in str(info.value)
    return str(info.value)


def test_the_keys_default_off_and_load():
    cfg = config.load()
    assert (cfg.training.freeze_epochs, cfg.optimizer.layer_decay, cfg.training.class_weights) == (0, None, "none")
    cfg = config.load(overrides=["training.freeze_epochs=2", "optimizer.layer_decay=0.65",
                                 "training.class_weights=auto"])
    assert (cfg.training.freeze_epochs, cfg.optimizer.layer_decay, cfg.training.class_weights) == (2, 0.65, "auto")


@pytest.mark.parametrize("overrides, start", [
    (["optimizer.layer_decay=0"], "config optimizer.layer_decay=0.0: must be in (0, 1]"),
    (["optimizer.layer_decay=1.5"], "config optimizer.layer_decay=1.5: must be in (0, 1]"),
    (["training.freeze_epochs=-1"], "config training.freeze_epochs=-1: must be >= 0"),
    (["training.class_weights=inverse"], "config training.class_weights='inverse': choose one of none, auto"),
    (["training.freeze_epochs=1", "training.zero=1"], "config training.freeze_epochs=1 with training.zero=1"),
    (["optimizer.layer_decay=0.8", "training.zero=2"], "config optimizer.layer_decay=0.8 with training.zero=2"),
    (["training.freeze_epochs=1", "training.elastic=true"],
     "config training.freeze_epochs=1 with training.elastic=true"),
    (["training.class_weights=auto", "data.cutmix_alpha=1.0"],
     "config training.class_weights=auto with data.mixup_alpha/cutmix_alpha"),
    (["training.class_weights=auto", "data.sampler=balanced"],
     "config training.class_weights=auto with data.sampler=balanced"),
], ids=["decay-0", "decay-above-1", "freeze-negative", "weights-choice", "freeze-zero", "decay-zero",
        "freeze-elastic", "weights-mixing", "weights-balanced"])
def test_what_fine_tuning_cannot_serve_is_one_line(overrides, start):
    assert user_error(*overrides).startswith(start)


def test_layer_decay_of_one_is_off_and_serves_zero():
    assert config.load(overrides=["optimizer.layer_decay=1.0", "training.zero=1"]).training.zero == 1


def test_the_fine_tuning_recipe_loads_as_a_fine_tuning_run():
    """configs/finetune.yaml: torchvision's weights with their preprocessing, the head alone first,
    layer decay, a lower rate than from scratch, cosine, smoothing, the imagenet augmentation."""
    cfg = config.load(REPO / "configs" / "finetune.yaml", ["data.path=/data/flowers"])
    assert cfg.model.weights == "DEFAULT" and cfg.model.name == "resnet50"
    assert cfg.data.mean == config.IMAGENET_MEAN and cfg.data.std == config.IMAGENET_STD  # the weights' own
    assert 1 <= cfg.training.freeze_epochs <= 2 < cfg.training.epochs
    assert 0 < cfg.optimizer.layer_decay < 1
    assert cfg.optimizer.lr < config.DEFAULT_LR  # a number: the recipe's, not the range test
    assert cfg.schedule.name == "cosine" and cfg.training.label_smoothing == 0.1
    assert cfg.data.augment.preset == "imagenet" and cfg.training.class_weights == "none"
    assert config.load(REPO / "configs" / "finetune.yaml",
                       ["data.path=/d", "training.class_weights=auto"]).training.class_weights == "auto"
