"""tf_backend.models, in process (no hvd.init): compact_cnn against the framework-free spec in
hvdcls.models, and model names.

Mirror: tests/torch_backend/test_models.py (same tests, same expected numbers, by construction).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from hvdcls import models as spec  # noqa: E402
from hvdcls.errors import UserError  # noqa: E402
from tf_backend import models  # noqa: E402

CLASSES = 10


def conv_count() -> int:
    return sum(isinstance(layer, spec.Conv) for layer in spec.COMPACT_CNN_LAYERS)


@pytest.mark.parametrize("size", [8, 16, 32])
def test_compact_cnn_maps_images_to_logits(size):
    model = models.compact_cnn(CLASSES, size)
    images = np.random.default_rng(0).standard_normal((4, size, size, 3)).astype(np.float32)  # NHWC
    logits = keras.ops.convert_to_numpy(model(images, training=False))
    assert logits.shape == (4, CLASSES)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()


@pytest.mark.parametrize("classes", [2, 10])
def test_compact_cnn_parameter_count_follows_the_spec(classes):
    model = models.compact_cnn(classes, 16)
    assert models.count_parameters(model) == spec.compact_cnn_parameters(classes)
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == spec.compact_cnn_parameters(classes)


def test_compact_cnn_batch_norm_follows_the_spec():
    norms = [layer for layer in models.compact_cnn(CLASSES, 16).layers
             if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(norms) == conv_count()
    for norm in norms:
        assert norm.epsilon == spec.BN_EPSILON
        assert norm.momentum == 1 - spec.BN_MOMENTUM  # Keras: the weight of the old statistics
        assert norm.center and norm.scale


@pytest.mark.parametrize("name", ["compact_cnn", "CompactCNN", "compact-cnn"])
def test_compact_cnn_name_is_normalised(name):
    model = models.build_model(name, CLASSES, 16)
    assert models.count_parameters(model) == spec.compact_cnn_parameters(CLASSES)


@pytest.mark.parametrize("names", [("mobilenet_v2", "MobileNetV2", "mobilenet-v2")])
def test_model_names_are_normalised(names):
    built = [models.build_model(name, CLASSES, 32) for name in names]
    assert len({model.name for model in built}) == 1
    counts = {models.count_parameters(model) for model in built}
    assert len(counts) == 1
    model = built[1]
    assert model.output_shape == (None, CLASSES)
    images = np.zeros((2, 32, 32, 3), np.float32)
    assert keras.ops.convert_to_numpy(model(images, training=False)).shape == (2, CLASSES)


def test_unknown_model_is_a_one_line_user_error():
    with pytest.raises(UserError) as caught:
        models.build_model("no_such_net", CLASSES, 32)
    message = str(caught.value)
    assert "no_such_net" in message and "\n" not in message


def test_convert_sync_batchnorm_replaces_every_batchnorm():
    from tf_backend.sync_bn import SyncBatchNormalization, convert_sync_batchnorm

    model = models.build_model("compact_cnn", CLASSES, 16)
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    converted = convert_sync_batchnorm(model)
    kinds = [type(layer) for layer in converted.layers]
    assert keras.layers.BatchNormalization not in kinds
    assert kinds.count(SyncBatchNormalization) == conv_count()
    assert [v.shape for v in converted.variables] == [v.shape for v in model.variables]
    for before, after in zip(model.get_weights(), converted.get_weights()):
        np.testing.assert_array_equal(before, after)
    # Its forward pass against plain batch norm: tests/parallel/test_sync_bn.py (2 ranks).
