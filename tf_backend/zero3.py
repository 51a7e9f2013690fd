"""training.zero=3 for the TensorFlow backend: the trained variables sharded too, block by block.

Mirror: torch_backend/zero3.py. A block (hvdcls.maths.zero.blocks) is one top-level layer of the
Keras model: a ViT's encoder block, its patch embedding, tokens, final norm and head; for a
keras.applications ResNet or compact_cnn each convolution, batch norm and dense layer (Keras
builds them as flat functional graphs: no stage is a layer whose call could gather it). Each
block is one flat bucket; this rank keeps its slice in the ShardedOptimizer's `shards` (one
Keras variable per block, stepped by the local optimizer) and the Keras variables keep their
shapes but no storage (their tf.Variable swapped for an empty one).

The gather: each block's call (an encoder block's `block`, the function tf.recompute_grad
recomputes, so with training.activation_checkpointing the recomputation in backward gathers
again) all-gathers the block's slices into the full flat bucket and runs inside
keras.StatelessScope, which maps every variable of the block to its piece of it. The gather is a
tf.custom_gradient whose backward reduce-scatters (averages) the gradient of the full bucket, so
the tape hands the step this rank's slice of the ranks' averaged gradient, as backward leaves
the block. Without recomputation the gathered tensors live until backward has used them (the
tape keeps what the gradients need); with it, only the block's input does. Assignments inside a
StatelessScope are recorded, not applied: a block's non-trainable variables (batch norm's
moving statistics) are assigned from the scope after its call.

Every rank runs the same calls in the same order, so the collectives match; evaluation (no
gradients) gathers the same way. Outside the step, full_state() gathers a block at a time, as read
(the digests, tests); checkpoints are the shard files, each rank its parameters' and
optimizer's slices (tf_backend/strategies/zero3.py).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Callable, Mapping, Optional

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdcls.backend import LazyArrays
from hvdcls.errors import UserError
from hvdcls.maths import zero as zero_plan
from tf_backend.strategies import tf_variables
from tf_backend.vit import EncoderBlock
from tf_backend.zero import ShardedOptimizer, tf_values

LEVEL = 3
FLOAT32_BYTES = 4


def block_layers(model: keras.Model) -> list:
    """The top-level layers that hold trainable variables: the blocks' owners."""
    return [layer for layer in model.layers if layer.trainable_variables]


def model_blocks(model: keras.Model, variables: list, world: int) -> list[zero_plan.Block]:
    """`variables` (the model's trainable ones, in order) cut into one block per top-level layer."""
    layers = block_layers(model)
    owner = {id(v): layer.name for layer in layers for v in layer.trainable_variables}
    loose = [v.path for v in variables if id(v) not in owner]
    if loose:
        raise UserError(f"training.zero=3: variable {loose[0]} belongs to no layer of the model's top level; "
                        "use training.zero=2")
    names = [f"{owner[id(v)]}.{v.path}" for v in variables]  # the owner first: hvdcls.maths.zero.owner
    return zero_plan.blocks(names, [tuple(v.shape) for v in variables], world, [layer.name for layer in layers])


def free(variable) -> None:
    """The Keras variable keeps its shape and dtype; its storage goes (the slices hold it).
    `_value`, the tf.Variable under a Keras 3 variable, is private: Keras has no public way to
    drop a variable's storage and keep the variable (checked on Keras 3.15)."""
    variable._value = tf.Variable(tf.zeros([0], variable.dtype), trainable=False)


class ShardedParameters(ShardedOptimizer):
    """The ShardedOptimizer over the blocks' buckets, whose slices (`shards`) are the parameters
    themselves, gathered for each block's call by a wrapper of it."""

    def __init__(self, model: keras.Model, variables: list, make_optimizer: Callable[[], keras.optimizers.Optimizer],
                 l2: float = 0.0, clip: Optional[float] = None):
        self.blocks = model_blocks(model, variables, hvd.size())
        self.rank = hvd.rank()  # _own's, before the base class sets it
        buckets = [b.bucket for b in self.blocks]
        slices = [self._slice_and_free(bucket, variables) for bucket in buckets]  # before the optimizer's state exists
        super().__init__(variables, make_optimizer, LEVEL, l2=l2, clip=clip, buckets=buckets, slices=slices)
        del slices
        layers = {layer.name: layer for layer in block_layers(model)}
        for b, block in enumerate(self.blocks):
            self._hook(layers[block.module], b)

    def _slice_and_free(self, bucket, variables: list) -> np.ndarray:
        """This rank's slice of rank 0's values of one block, whose variables then lose their
        storage: a block at a time, so that the whole model, the broadcast's copies of it and
        the optimizer's state never coexist (ViT-g/14 was killed here at 10.5 GB a rank)."""
        mine = [variables[i] for i in bucket.params]
        hvd.broadcast_variables(tf_variables(mine), root_rank=0)  # Horovod: every rank cuts rank 0's
        owned = self._own(bucket, tf_values(variables)).numpy()
        for v in mine:
            free(v)
        return owned

    def _hook(self, layer, b: int) -> None:
        """The layer's call (an encoder block's recomputed `block`) runs on the gathered block."""
        name = "block" if isinstance(layer, EncoderBlock) else "call"
        original = getattr(layer, name)

        def gathered_call(*args, **kwargs):
            first = args[0] if args else next(iter(kwargs.values()), None)  # the block's input
            with self.gathered_block(layer, b, first):
                return original(*args, **kwargs)

        setattr(layer, name, gathered_call)

    @contextmanager
    def gathered_block(self, layer, b: int, x=None):
        """Inside: the block's variables read their pieces of the gathered bucket, gathered
        once `x` (the block's input) exists."""
        full = self._gather(b, x)
        bucket = self.buckets[b]
        mapping = [(self.variables[i], tf.cast(tf.reshape(full[offset:offset + size], self.variables[i].shape),
                                               self.variables[i].dtype))
                   for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes)]
        with keras.StatelessScope(state_mapping=mapping) as scope:
            yield
        for v in layer.non_trainable_variables:  # recorded in the scope (BN statistics): applied now
            value = scope.get_current_value(v)
            if value is not None:
                v.assign(value)

    def _gather(self, b: int, after=None) -> tf.Tensor:
        """Horovod: the block's full flat bucket (padded); its gradient reduce-scattered back.
        In a traced step the gather waits for `after` (the block's input): a gather reads only
        its slice, so without the edge TensorFlow's executor may run every block's gather, and
        what derives from the weights alone (their casts, transposes), at the step's start, the
        recomputations' too (ViT-B/16 at np=2 held 3 GB more a rank)."""
        @tf.custom_gradient
        def gather(local):
            def backward(upstream):
                return hvd.reducescatter(upstream, op=hvd.Average, name=f"zero3.grads.{b}")
            return hvd.allgather(local, name=f"zero3.params.{b}"), backward

        with tf.control_dependencies([] if after is None or not tf.is_tensor(after) else [after]):
            local = tf.identity(self.shards[b].value)  # the read the tape differentiates
        return gather(local)

    def sources(self) -> list:
        """What the step differentiates: the slices (their gradients come reduce-scattered)."""
        return tf_variables(self.shards)

    def held_param_bytes(self) -> int:
        return FLOAT32_BYTES * sum(b.shard for b in self.buckets)

    def gathered_peak_bytes(self) -> int:
        """One block gathered at a time by the calls (without activation checkpointing the tape
        keeps each gathered block until backward, beside it)."""
        return FLOAT32_BYTES * max(b.padded for b in self.buckets)

    def sent_per_pass(self, recomputed: bool) -> int:
        """Bytes handed to Horovod per forward and backward: each block's slice gathered (twice
        with recomputation), its full gradient reduce-scattered."""
        return FLOAT32_BYTES * sum(b.shard * (2 if recomputed else 1) + b.padded for b in self.buckets)

    def full_state(self, model: keras.Model) -> LazyArrays:
        """The unsharded variables by path, in the model's order, each gathered when it is read:
        its block all-gathered once and kept until another block is read (a collective: every
        rank reads the same paths in the same order, as the digests do), so a walk over them
        holds one block, not the whole model (ViT-g/14's 4 GB a rank, as torch's says)."""
        where = {id(self.variables[i]): (b, offset, size) for b, bucket in enumerate(self.buckets)
                 for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes)}
        held: dict[int, np.ndarray] = {}

        def gathered(variable) -> np.ndarray:
            if id(variable) not in where:  # not sharded (batch norm's statistics)
                return np.asarray(variable.numpy())
            b, offset, size = where[id(variable)]
            if b not in held:
                held.clear()  # the block read before goes first
                held[b] = hvd.allgather(self.shards[b].value, name=f"zero3.state.{b}").numpy()  # Horovod
            return held[b][offset:offset + size].reshape(variable.shape)

        return LazyArrays({v.path: partial(gathered, v) for v in model.variables})

    # Checkpoints: the parameters' slices in the shard files, beside the optimizer's.

    def shard_arrays(self) -> dict:
        arrays = super().shard_arrays()
        arrays.update({f"param/{b}": shard.numpy for b, shard in enumerate(self.shards)})
        return arrays

    def assign_shard_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        super().assign_shard_arrays(arrays)
        for b, shard in enumerate(self.shards):
            shard.assign(arrays[f"param/{b}"])

    def index(self) -> dict:
        """What rank 0's checkpoint says of the shards: enough to find a variable in them."""
        return {"world": self.size, "blocks": [block.index() for block in self.blocks]}

    def check_index(self, index: dict, describe: str) -> None:
        """A checkpoint's index must list this model's blocks (the world size may differ): their
        shapes and offsets, not their names (Keras numbers a layer's default name by the layers
        the process built before it: conv2d_12 in one process is conv2d in the next)."""
        if [layout(b) for b in index.get("blocks", [])] != [layout(b.index()) for b in self.blocks]:
            raise UserError(f"cannot load {describe}: its training.zero=3 blocks are not this model's")


def layout(block: dict) -> tuple[list, list]:
    return [tuple(s) for s in block["shapes"]], block["offsets"]
