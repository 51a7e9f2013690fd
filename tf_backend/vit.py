"""The vision transformers for the TensorFlow backend, built here (Keras 3 has none in
keras.applications) with the sizes of hvdcls.models.VIT, laid out as torchvision's
VisionTransformer is: the same parameters, tensor for tensor in count (tests hold both to
hvdcls.models.vit_parameters).

Patch-embedding conv (stride = patch), a class token and learned position embeddings, pre-norm
encoder blocks (LayerNorm, multi-head self-attention, residual; LayerNorm, MLP with exact
GELU, residual), a final LayerNorm and a linear head on the class token. Initialisers follow
torchvision's where Keras has the same one (the conv's N(0, 1/fan_in), positions N(0, 0.02),
zero class token and head, Glorot MLP with N(0, 1e-6) biases); the attention's projections
keep Keras' own (Glorot over its per-head kernels, zero biases), which torch lays out as one
in_proj matrix: the distributions differ there by design, the shapes do not.

Mirror: torch_backend/vit.py.
"""
from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from hvdcls.models import VIT_LN_EPSILON, ViT, vit_patches

SQRT_HALF, INV_SQRT_2PI = 0.7071067811865476, 0.3989422804014327  # 1/sqrt(2), 1/sqrt(2 pi)


def gelu(x):
    """torch's nn.GELU(), the erf form, with a backward that reads its input alone, as torch's
    does: the form TensorFlow builds from primitives keeps three more tensors of the MLP's width
    for backward (its intermediates), as tf_backend/activations.py counts."""
    return gelu_keeping_input(x)


@tf.custom_gradient
def gelu_keeping_input(x):
    def backward(upstream):
        cdf = 0.5 * (1.0 + tf.math.erf(x * tf.cast(SQRT_HALF, x.dtype)))
        density = tf.exp(-0.5 * tf.square(x)) * tf.cast(INV_SQRT_2PI, x.dtype)
        return upstream * (cdf + x * density)  # d/dx x * cdf(x)
    return keras.activations.gelu(x, approximate=False), backward


class Tokens(keras.layers.Layer):
    """(batch, patches, hidden) -> the class token in front, plus the position embeddings."""

    def __init__(self, patches: int, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.patches, self.hidden = patches, hidden
        self.class_token = self.add_weight((1, 1, hidden), initializer="zeros", name="class_token")
        self.positions = self.add_weight((1, patches + 1, hidden), name="pos_embedding",
                                         initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x):
        token = tf.repeat(tf.cast(self.class_token, x.dtype), tf.shape(x)[0], axis=0)
        return tf.concat([token, x], axis=1) + tf.cast(self.positions, x.dtype)

    def get_config(self) -> dict:  # keras.models.clone_model (horovod.sync_bn) rebuilds from it
        return {**super().get_config(), "patches": self.patches, "hidden": self.hidden}


class EncoderBlock(keras.layers.Layer):
    """One pre-norm transformer block; with `recompute` (training.activation_checkpointing,
    tf_backend/recompute.py) its activations are recomputed in the backward pass
    (tf.recompute_grad) instead of kept."""

    def __init__(self, spec: ViT | dict, **kwargs):
        super().__init__(**kwargs)
        self.spec = spec = spec if isinstance(spec, ViT) else ViT(**spec)
        self.recompute = False  # read when the training step is traced
        # made in this order, so that the variables come in it (the checkpoints' order)
        self.ln_1 = keras.layers.LayerNormalization(epsilon=VIT_LN_EPSILON, name="ln_1")
        self.attention = self.make_attention(spec)
        self.ln_2 = keras.layers.LayerNormalization(epsilon=VIT_LN_EPSILON, name="ln_2")
        mlp = {"kernel_initializer": "glorot_uniform",  # made per block: an initialiser holds its seed
               "bias_initializer": keras.initializers.RandomNormal(stddev=1e-6)}
        self.mlp_1, self.mlp_2 = self.make_mlp(spec, mlp)

    def make_attention(self, spec: ViT) -> keras.layers.Layer:
        """The attention (tf_backend/tensor_parallel.py makes its split one)."""
        return keras.layers.MultiHeadAttention(spec.heads, spec.hidden // spec.heads, name="self_attention")

    def make_mlp(self, spec: ViT, init: dict) -> tuple[keras.layers.Layer, keras.layers.Layer]:
        return (keras.layers.Dense(spec.mlp, activation=gelu, name="mlp_1", **init),
                keras.layers.Dense(spec.hidden, name="mlp_2", **init))

    def get_config(self) -> dict:  # as Tokens'
        return {**super().get_config(), "spec": dataclasses.asdict(self.spec)}

    def build(self, input_shape):
        self.ln_1.build(input_shape)
        self.attention.build(input_shape, input_shape)
        self.ln_2.build(input_shape)
        self.mlp_1.build(input_shape)
        self.mlp_2.build((*input_shape[:-1], self.mlp_1.units))

    def block(self, x):
        y = self.ln_1(x)
        x = x + self.attention(y, y)
        return x + self.mlp_2(self.mlp_1(self.ln_2(x)))

    def call(self, x, training=None):
        if self.recompute and training:
            return tf.recompute_grad(self.block)(x)
        return self.block(x)


def vision_transformer(spec: ViT, num_classes: int, image_size: int, patch_size: int | None = None,
                       name: str = "vit") -> keras.Model:
    """An untrained ViT on NHWC images; `patch_size` None: the architecture's own."""
    patch = patch_size or spec.patch_size
    patches = vit_patches(image_size, patch)
    images = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(spec.hidden, patch, strides=patch, name="conv_proj",
                            # torch's trunc_normal_(std=sqrt(1/fan_in)) cuts at +-2 absolute: untruncated here
                            kernel_initializer=keras.initializers.VarianceScaling(1.0, "fan_in", "untruncated_normal"),
                            bias_initializer="zeros")(images)
    x = keras.layers.Reshape((patches, spec.hidden))(x)  # row-major patches, as torch flattens them
    x = Tokens(patches, spec.hidden, name="tokens")(x)
    for i in range(spec.layers):
        x = EncoderBlock(spec, name=f"encoder_layer_{i}")(x)
    x = keras.layers.LayerNormalization(epsilon=VIT_LN_EPSILON, name="ln")(x)
    head = keras.layers.Dense(num_classes, kernel_initializer="zeros", bias_initializer="zeros",
                              dtype="float32", name="head")  # logits in float32 under AMP
    return keras.Model(images, head(x[:, 0]), name=name)
