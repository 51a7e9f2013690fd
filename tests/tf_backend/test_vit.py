"""tf_backend.vit and tf_backend.recompute, in process: the ViTs against the table in
hvdcls.models (so against torchvision's, tests/torch_backend/test_vit.py), and activation
checkpointing leaving one step's gradients as they were.

Mirror: tests/torch_backend/test_vit.py (same cases; torch alone checks the table against
torchvision's builders, and checkpoints ResNet stages, which TensorFlow refuses).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvdcls import models as spec  # noqa: E402
from hvdcls.errors import UserError  # noqa: E402
from tf_backend import models, recompute  # noqa: E402
from tf_backend.vit import EncoderBlock  # noqa: E402

CLASSES = 10
TINY = spec.ViT(patch_size=4, hidden=16, layers=2, heads=2, mlp=32)  # the checkpointing tests'


def test_vit_b_16_at_32_px_in_patches_of_8_maps_images_to_logits():
    """The same parameter count as torchvision's ViT-B/16 at this size, exactly."""
    model = models.build_model("ViT-B-16", CLASSES, image_size=32, patch_size=8)
    assert models.count_parameters(model) == spec.vit_parameters(spec.VIT["vit_b_16"], CLASSES, 32, 8)
    assert model.get_layer("tokens").positions.shape == (1, 16 + 1, 768)
    logits = keras.ops.convert_to_numpy(model(np.zeros((2, 32, 32, 3), np.float32), training=False))
    assert logits.shape == (2, CLASSES) and np.isfinite(logits).all()


def test_an_image_the_patches_do_not_tile_is_a_one_line_user_error():
    with pytest.raises(UserError) as caught:
        models.build_model("vit_b_16", CLASSES, image_size=30, patch_size=8)
    assert "data.image_size=30" in str(caught.value) and "\n" not in str(caught.value)


def one_step_gradients(model, size: int) -> list:
    """One loss's gradients, in a tf.function as the backend's training step is."""
    rng = np.random.default_rng(1)
    images = tf.constant(rng.standard_normal((4, size, size, 3)).astype(np.float32))
    labels = tf.constant([0, 1, 2, 3])

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        return tape.gradient(loss, [v.value for v in model.trainable_variables])

    return [g.numpy() for g in gradients()]


def tiny_vit() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = models.vision_transformer(TINY, CLASSES, image_size=8)
    head = model.get_layer("head")  # a zero head would leave every other gradient 0
    head.kernel.assign(np.random.default_rng(0).standard_normal(head.kernel.shape).astype(np.float32))
    return model


def test_checkpointing_leaves_one_steps_gradients_and_state_as_they_were(monkeypatch):
    model = tiny_vit()
    weights = [v.numpy() for v in model.variables]
    expected = one_step_gradients(model, 8)
    wrapped = []
    recompute_grad = tf.recompute_grad
    monkeypatch.setattr(tf, "recompute_grad", lambda f: wrapped.append(f) or recompute_grad(f))
    got = one_step_gradients(recompute.enable(model, "vit"), 8)  # a new trace: recomputed
    assert len(wrapped) == TINY.layers  # each block, once per trace
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-5)
    for before, after in zip(weights, model.variables):
        np.testing.assert_array_equal(after.numpy(), before)


def test_checkpointing_wraps_each_encoder_block_and_each_stage():
    """Every encoder block; no stage: keras.applications' ResNets are refused (below)."""
    blocks = [layer for layer in recompute.enable(tiny_vit(), "vit").layers if isinstance(layer, EncoderBlock)]
    assert len(blocks) == TINY.layers and all(block.recompute for block in blocks)


@pytest.mark.parametrize("name", ["compact_cnn", "resnet50"])
def test_checkpointing_a_model_it_cannot_serve_is_a_one_line_user_error(name):
    with pytest.raises(UserError) as caught:
        recompute.enable(models.build_model(name, CLASSES, 32), name)
    assert name in str(caught.value) and "\n" not in str(caught.value)


def test_a_vit_survives_keras_clone_model():
    """horovod.sync_bn rebuilds the model with clone_model: the ViT's own layers come back."""
    clone = keras.models.clone_model(tiny_vit())
    assert models.count_parameters(clone) == spec.vit_parameters(TINY, CLASSES, 8, TINY.patch_size)
