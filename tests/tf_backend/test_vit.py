"""tf_backend.vit and tf_backend.recompute, in process: the ViTs against the table in
hvdcls.models (so against torchvision's, tests/torch_backend/test_vit.py), and activation
checkpointing leaving one step's gradients as they were.

Mirror: tests/torch_backend/test_vit.py (same cases; torch alone checks the table against
torchvision's builders, and checkpoints ResNet stages, which TensorFlow refuses). Two cases are
here alone: torchvision's weights, loaded into our ViT, give its logits (both frameworks); the
GELU's own gradient (torch's nn.GELU comes with one).
"""
import dataclasses
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvdcls import models as spec  # noqa: E402
from hvdcls.errors import UserError  # noqa: E402
from tf_backend import models, recompute  # noqa: E402
from tf_backend.vit import EncoderBlock, gelu  # noqa: E402

CLASSES = 10
TINY = spec.ViT(patch_size=4, hidden=16, layers=2, heads=2, mlp=32)  # the checkpointing tests'


def test_vit_b_16_at_32_px_in_patches_of_8_maps_images_to_logits():
    """The same parameter count as torchvision's ViT-B/16 at this size, exactly."""
    model = models.build_model("ViT-B-16", CLASSES, image_size=32, patch_size=8)
    assert models.count_parameters(model) == spec.vit_parameters(spec.VIT["vit_b_16"], CLASSES, 32, 8)
    assert model.get_layer("tokens").positions.shape == (1, 16 + 1, 768)
    logits = keras.ops.convert_to_numpy(model(np.zeros((2, 32, 32, 3), np.float32), training=False))
    assert logits.shape == (2, CLASSES) and np.isfinite(logits).all()


@pytest.mark.parametrize("name, timm_count", [("vit_ti_16", 5_717_416), ("vit_s_16", 22_050_664)])
def test_the_small_vits_are_deits_sizes(name, timm_count):
    """ViT-Ti/16 and ViT-S/16 by name at 224 px with 1,000 classes: timm's counts."""
    model = models.build_model(name, 1000, image_size=224)
    assert models.count_parameters(model) == spec.vit_parameters(spec.VIT[name], 1000, 224, 16) == timm_count


@pytest.mark.parametrize("name", ["vit_g_14", "vit_bigg_14"])
def test_a_billion_parameter_vits_block_is_built_to_the_formula(name):
    """ViT-g/14 and ViT-G/14 with their widths but one block (Keras allocates what it builds:
    4 GB and 7 GB whole): the formula's count; the formula is linear in the blocks, and the
    torch mirror holds it to the whole models' counts and to the paper."""
    one_block = dataclasses.replace(spec.VIT[name], layers=1)
    model = models.vision_transformer(one_block, CLASSES, image_size=28)
    assert models.count_parameters(model) == spec.vit_parameters(one_block, CLASSES, 28, 14)


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


@pytest.mark.parametrize("dtype, tolerance", [(tf.float32, 1e-6), (tf.bfloat16, 1e-2)])
def test_gelu_is_the_erf_form_and_its_gradient_is_the_composed_forms(dtype, tolerance):
    """The ViT's GELU computes Keras' exact one and, from its input alone, the gradient that
    autodiff of the composed form gives (to rounding: the two formulas order it differently)."""
    x = tf.cast(tf.linspace(-6.0, 6.0, 241), dtype)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        mine, composed = gelu(x), keras.activations.gelu(x, approximate=False)
    assert np.array_equal(mine.numpy(), composed.numpy())
    np.testing.assert_allclose(tf.cast(tape.gradient(mine, x), tf.float32).numpy(),
                               tf.cast(tape.gradient(composed, x), tf.float32).numpy(), atol=tolerance)


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


# torch's tiny ViT, in its own process (horovod.tensorflow and torch in one process do not
# mix, tests/tf_backend/test_batches.py): its state dict and its logits on fixed images.
TORCH_SIDE = """
import sys, numpy as np, torch
from hvdcls.models import ViT
from torch_backend.vit import vision_transformer
torch.manual_seed(0)
model = vision_transformer(ViT(*map(int, sys.argv[2:7])), 5, 8).eval()
for p in model.parameters():
    torch.nn.init.normal_(p, std=0.3)  # every tensor away from its init: a mapping slip shows
images = np.random.default_rng(0).standard_normal((3, 8, 8, 3)).astype(np.float32)
with torch.no_grad():
    logits = model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
np.savez(sys.argv[1], images=images, logits=logits, **{k: v.numpy() for k, v in model.state_dict().items()})
"""


def load_torch_state(model, state, spec) -> None:
    """torchvision's ViT tensors into ours: conv OIHW -> HWIO, Linear (out, in) -> (in, out),
    and MultiheadAttention's one in_proj matrix split into Keras' per-head q, k, v kernels."""
    h, heads = spec.hidden, spec.heads
    per_head = (h, heads, h // heads)
    model.get_layer("conv_proj").set_weights([state["conv_proj.weight"].transpose(2, 3, 1, 0), state["conv_proj.bias"]])
    model.get_layer("tokens").set_weights([state["class_token"], state["encoder.pos_embedding"]])
    for i in range(spec.layers):
        block, prefix = model.get_layer(f"encoder_layer_{i}"), f"encoder.layers.encoder_layer_{i}."
        for norm in ("ln_1", "ln_2"):
            getattr(block, norm).set_weights([state[prefix + norm + ".weight"], state[prefix + norm + ".bias"]])
        weight, bias = state[prefix + "self_attention.in_proj_weight"], state[prefix + "self_attention.in_proj_bias"]
        attention = block.attention
        for j, dense in enumerate((attention._query_dense, attention._key_dense, attention._value_dense)):
            rows = slice(j * h, (j + 1) * h)
            dense.set_weights([weight[rows].T.reshape(per_head), bias[rows].reshape(per_head[1:])])
        attention._output_dense.set_weights([state[prefix + "self_attention.out_proj.weight"].T.reshape(
            heads, h // heads, h), state[prefix + "self_attention.out_proj.bias"]])
        block.mlp_1.set_weights([state[prefix + "mlp.0.weight"].T, state[prefix + "mlp.0.bias"]])
        block.mlp_2.set_weights([state[prefix + "mlp.3.weight"].T, state[prefix + "mlp.3.bias"]])
    model.get_layer("ln").set_weights([state["encoder.ln.weight"], state["encoder.ln.bias"]])
    model.get_layer("head").set_weights([state["heads.head.weight"].T, state["heads.head.bias"]])


def test_with_torchvisions_weights_it_computes_torchvisions_logits(tmp_path):
    """The same architecture, not only the same count: torchvision's ViT's tensors, loaded
    here, give its logits (to float32 rounding)."""
    import subprocess
    import sys

    out = tmp_path / "torch_vit.npz"
    sizes = [TINY.patch_size, TINY.hidden, TINY.layers, TINY.heads, TINY.mlp]
    subprocess.run([sys.executable, "-c", TORCH_SIDE, str(out), *map(str, sizes)], check=True, timeout=120,
                   cwd=Path(__file__).resolve().parents[2])  # the repository: its packages importable
    with np.load(out) as stored:
        state = dict(stored)
    model = models.vision_transformer(TINY, 5, 8)
    load_torch_state(model, state, TINY)
    logits = keras.ops.convert_to_numpy(model(state["images"], training=False))
    np.testing.assert_allclose(logits, state["logits"], rtol=0, atol=1e-5)
