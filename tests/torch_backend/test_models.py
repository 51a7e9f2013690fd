"""torch_backend.models, in process (no hvd.init): compact_cnn against the framework-free spec in
hvdcls.models, model names, and the conversion to synchronised batch norm.

Mirror: tests/tf_backend/test_models.py (same tests, same expected numbers, by construction).
"""
import pytest
import torch
from torch import nn

from hvdcls import models as spec
from hvdcls.errors import UserError
from torch_backend import models
from torch_backend.sync_bn import SyncBatchNorm

CLASSES = 10


def conv_count() -> int:
    return sum(isinstance(layer, spec.Conv) for layer in spec.COMPACT_CNN_LAYERS)


@pytest.mark.parametrize("size", [8, 16, 32])
def test_compact_cnn_maps_images_to_logits(size):
    model = models.compact_cnn(CLASSES).eval()
    with torch.no_grad():
        logits = model(torch.randn(4, 3, size, size))  # NCHW
    assert logits.shape == (4, CLASSES)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


@pytest.mark.parametrize("classes", [2, 10])
def test_compact_cnn_parameter_count_follows_the_spec(classes):
    model = models.compact_cnn(classes)
    assert models.count_parameters(model) == spec.compact_cnn_parameters(classes)
    assert sum(p.numel() for p in model.parameters()) == spec.compact_cnn_parameters(classes)


def test_compact_cnn_batch_norm_follows_the_spec():
    norms = [m for m in models.compact_cnn(CLASSES).modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(norms) == conv_count()
    for norm in norms:
        assert norm.eps == spec.BN_EPSILON
        assert norm.momentum == spec.BN_MOMENTUM  # torch: the weight of the new statistics
        assert norm.affine and norm.track_running_stats


@pytest.mark.parametrize("name", ["compact_cnn", "CompactCNN", "compact-cnn"])
def test_compact_cnn_name_is_normalised(name):
    assert models.count_parameters(models.build_model(name, CLASSES)) == spec.compact_cnn_parameters(CLASSES)


@pytest.mark.parametrize("names", [("resnet18", "ResNet18", "res_net_18")])
def test_model_names_are_normalised(names):
    built = [models.build_model(name, CLASSES) for name in names]
    assert {type(model) for model in built} == {type(built[0])}
    counts = {models.count_parameters(model) for model in built}
    assert len(counts) == 1
    model = built[1].eval()
    assert model.fc.out_features == CLASSES
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, CLASSES)


def test_unknown_model_is_a_one_line_user_error():
    with pytest.raises(UserError) as caught:
        models.build_model("no_such_net", CLASSES)
    message = str(caught.value)
    assert "no_such_net" in message and "\n" not in message


def randomise_batch_norm(model: nn.Module) -> None:
    """Non-default values, so that a conversion that forgot to copy them is caught."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            for tensor in (module.weight, module.bias, module.running_mean):
                tensor.data.copy_(torch.randn(tensor.shape, generator=generator))
            module.running_var.data.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
            module.num_batches_tracked.fill_(7)


@pytest.mark.parametrize("name", ["compact_cnn", "resnet18"])  # flat, and nested in blocks
def test_convert_sync_batchnorm_replaces_every_batchnorm(name):
    model = models.build_model(name, CLASSES)
    randomise_batch_norm(model)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    norms = [(m.num_features, m.eps, m.momentum) for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    parameters = models.count_parameters(model)

    converted = models.convert_sync_batchnorm(model, SyncBatchNorm)

    assert not [m for m in converted.modules() if type(m) is nn.BatchNorm2d]
    syncs = [m for m in converted.modules() if isinstance(m, SyncBatchNorm)]
    assert [(m.num_features, m.eps, m.momentum) for m in syncs] == norms
    assert all(m.weight.requires_grad and m.bias.requires_grad for m in syncs)
    assert models.count_parameters(converted) == parameters
    after = converted.state_dict()
    assert list(after) == list(before)  # same names, same order: checkpoints stay loadable
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    # Its forward pass against plain batch norm: tests/parallel/test_sync_bn.py (2 ranks).
