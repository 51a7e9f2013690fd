"""training.zero=3's machinery on torch in one process (torch_backend/zero3.py): the models whose
blocks the 2-rank launch (tests/zero_step.py, compact_cnn) does not reach, a ViT's encoder blocks
and a ResNet's stages under activation checkpointing, where the hooks must gather again inside
the recomputation. At one rank the gather and the reduce-scatter hand the block back whole, so
the sharded model's slices' gradients are the whole model's, element for element; each block's
gather is started ahead, once, in forward's order and then in the recomputations' (reversed)."""
import copy

import pytest


def tiny(kind: str):
    from torchvision.models import resnet18
    from torchvision.models.vision_transformer import VisionTransformer

    if kind == "vit":
        return VisionTransformer(image_size=8, patch_size=4, num_layers=3, num_heads=2, hidden_dim=8, mlp_dim=16,
                                 num_classes=3), 8
    return resnet18(num_classes=3), 32


@pytest.mark.parametrize("kind", ["vit", "resnet"])
def test_a_checkpointed_model_sharded_by_block_has_the_whole_ones_gradients(kind):
    import horovod.torch as hvd
    import torch

    from torch_backend import recompute, zero3

    hvd.init()
    torch.manual_seed(0)
    whole, side = tiny(kind)
    whole = recompute.enable(whole, kind)
    model = copy.deepcopy(whole)
    names = [name for name, _ in whole.named_parameters()]
    sharded = zero3.ShardedParameters(model)
    assert not list(model.parameters())  # the slices are the only copy
    modules = [block.module for block in sharded.blocks]
    expected = {"vit": ["", "conv_proj", "encoder", "encoder.layers.encoder_layer_0"],
                "resnet": ["conv1", "bn1", "layer1", "layer2"]}[kind]
    assert modules[:4] == expected
    images, labels = torch.randn(2, 3, side, side), torch.tensor([0, 2])
    started: list = []
    start = sharded._start
    sharded._start = lambda b: (started.append(b), start(b))[1]
    for net in (whole, model):
        torch.nn.functional.cross_entropy(net(images), labels).backward()
    sharded.finish_scatters()  # the step's first act: the last reduce-scatters added to the slices
    assert sharded.held == set() and not sharded.pending  # every block's names dropped, no gather left
    # each gather started once, ahead of its block: in forward's order, then backward's recomputations
    assert started == list(range(len(sharded.blocks))) + sharded.recomputed[::-1]
    assert len(sharded.recomputed) == {"vit": 3, "resnet": 4}[kind]
    grads = dict(whole.named_parameters())
    for block, shard in zip(sharded.blocks, sharded.shards):
        flat = torch.cat([grads[name].grad.reshape(-1) for name in block.names])
        assert torch.equal(shard.grad[:flat.numel()], flat), block.module
    largest = max(block.bucket.padded * 4 for block in sharded.blocks)
    assert largest <= sharded.peak_bytes < sum(block.bucket.padded * 4 for block in sharded.blocks)
    whole.eval()
    model.eval()
    with torch.inference_mode():  # evaluation gathers too (Horovod's thread fills a normal tensor)
        assert torch.equal(whole(images), model(images))
    assert set(sharded.full_state(model)) == set(whole.state_dict()) and len(names) == len(
        [n for block in sharded.blocks for n in block.names])
