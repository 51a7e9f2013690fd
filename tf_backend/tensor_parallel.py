"""parallel.tensor for the TensorFlow backend: tf_backend/vit.py's ViT with each encoder block
split Megatron-LM's way over a tensor group of T ranks (hvdcls.maths.tensor_parallel: the layout
and which variable is cut how, by its Keras path), the collectives over Horovod process sets.

Megatron's two operators bracket each sub-layer (attention, MLP), as tf.custom_gradient
functions: `f` before the column-split layer is the identity forward and sums the input's
gradient over the group backward; `g` after the row-split layer sums the ranks' partial outputs
forward and passes the gradient through backward. The attention is Keras' MultiHeadAttention
with this rank's heads (its per-head kernels cut by heads), its output projection row-split;
the MLP's first Dense has this rank's units, its second is row-split. Everything else is whole
on every rank of a group and gets the same gradient on each, so the plain strategy averages
each variable over the ranks holding the same slice (`data_set`), one per replica.

Checkpoints stay in the TF ViT's own layout (`model/i`, `optimizer/i` in the T=1 model's and
optimizer's order, whole shapes): replica 0's group gathers them for rank 0 to write; a
resumed run's rank 0 keeps the whole arrays and deals every rank its slices.

Horovod's process sets are made at run time (hvd.init(process_sets="dynamic"), HorovodBackend),
every rank making every set in one order, once per process (hvdcls.horovod_backend.process_set).

Mirror: torch_backend/tensor_parallel.py.
"""
from __future__ import annotations

from typing import Any, Optional

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from keras import ops

from hvdcls.config import Config
from hvdcls.horovod_backend import TensorPlace
from hvdcls.maths import tensor_parallel as plan
from hvdcls.models import ViT
from tf_backend.strategies import tf_variables
from tf_backend.vit import EncoderBlock, gelu

Entry = tuple[str, Optional[str], Any]  # a checkpoint's key, the model path whose rule cuts it, the variable


class Channel:
    """The tensor group's sums of activations and of their gradients, and the bytes a training
    step sent (counted inside the compiled step, into a variable the strategy takes)."""

    def __init__(self, group: Any):
        self.process_set = group
        self.sent = tf.Variable(0, dtype=tf.int64, trainable=False)

    def allreduce(self, x, name: str):
        if x.dtype == tf.bfloat16:  # Horovod's TF ops take no bfloat16 (mixed_bfloat16): summed in float32
            return tf.cast(self.allreduce(tf.cast(x, tf.float32), name), x.dtype)
        return hvd.allreduce(x, op=hvd.Sum, name=name, process_set=self.process_set)  # Horovod

    def count(self, x) -> None:
        """A training sub-layer's two sums, of `x`'s shape: its output's forward, its input's
        gradient's backward (bfloat16 sent as float32)."""
        size = 4 if x.dtype == tf.bfloat16 else x.dtype.size
        self.sent.assign_add(2 * tf.size(x, tf.int64) * size)

    def take(self) -> int:
        """The bytes sent since the last take."""
        sent = int(self.sent.numpy())
        self.sent.assign(0)
        return sent


def copy_to_group(x, channel: Channel, name: str):
    """Megatron's f: identity forward, the gradient summed over the tensor group backward."""
    @tf.custom_gradient
    def f(x):
        return tf.identity(x), lambda grad: channel.allreduce(grad, name)
    return f(x)


def sum_over_group(x, channel: Channel, name: str):
    """Megatron's g: the ranks' partial outputs summed forward, the gradient passed through."""
    @tf.custom_gradient
    def g(x):
        return channel.allreduce(x, name), tf.identity
    return g(x)


def summed_with_bias(layer, partial, training):
    """A row-split layer's output: this rank's partial product summed over the group (its two
    sums counted in training), then the bias, whole on every rank, added once."""
    if training:
        layer.channel.count(partial)
    return ops.add(sum_over_group(partial, layer.channel, layer.tag), layer.bias)


class RowParallelDense(keras.layers.Dense):
    """This rank's input rows of a Dense: its partial product summed over the group, then the
    bias, whole on every rank, added once."""

    def __init__(self, units: int, channel: Channel, tag: str, **kwargs):
        super().__init__(units, **kwargs)
        self.channel, self.tag = channel, tag

    def call(self, inputs, training=None):
        return summed_with_bias(self, ops.matmul(inputs, self.kernel), training)


class RowParallelEinsumDense(keras.layers.EinsumDense):
    """The attention's output projection over this rank's heads: as RowParallelDense."""

    def __init__(self, channel: Channel, tag: str, **kwargs):
        super().__init__(**kwargs)
        self.channel, self.tag = channel, tag

    def call(self, inputs, training=None):
        return summed_with_bias(self, ops.einsum(self.equation, inputs, self.kernel), training)


class ParallelAttention(keras.layers.MultiHeadAttention):
    """Keras' self-attention on this rank's heads, its output projection row-split."""

    def __init__(self, heads: int, head_dim: int, channel: Channel, tag: str, **kwargs):
        super().__init__(heads, head_dim, **kwargs)
        self.channel, self.tag = channel, tag

    def _make_output_dense(self, query_shape, common_kwargs, name=None):
        whole = super()._make_output_dense(query_shape, common_kwargs, name)  # Keras' own equation and shape
        return RowParallelEinsumDense(self.channel, self.tag, **whole.get_config())


class ParallelEncoderBlock(EncoderBlock):
    """EncoderBlock with its heads and MLP units split over the tensor group: the same variable
    paths, in the same order, this rank's slices."""

    def __init__(self, spec: ViT, tensor: int, channel: Channel, **kwargs):
        self.tensor, self.channel = tensor, channel  # read by make_attention and make_mlp
        super().__init__(spec, **kwargs)

    def make_attention(self, spec: ViT) -> keras.layers.Layer:
        return ParallelAttention(spec.heads // self.tensor, spec.hidden // spec.heads, self.channel,
                                 f"tp_{self.name}_attention", name="self_attention")

    def make_mlp(self, spec: ViT, init: dict) -> tuple[keras.layers.Layer, keras.layers.Layer]:
        return (keras.layers.Dense(spec.mlp // self.tensor, activation=gelu, name="mlp_1", **init),
                RowParallelDense(spec.hidden, self.channel, f"tp_{self.name}_mlp", name="mlp_2", **init))

    def block(self, x):
        y = copy_to_group(self.ln_1(x), self.channel, f"tp_{self.name}_attention_grad")
        x = x + self.attention(y, y)
        return x + self.mlp_2(self.mlp_1(copy_to_group(self.ln_2(x), self.channel, f"tp_{self.name}_mlp_grad")))


class TensorParallel(TensorPlace):
    """One rank's place in parallel.tensor's layout, and what the backend and the plain
    strategy ask of it."""

    def __init__(self, layout: plan.Layout, rank: int):
        super().__init__(hvd, layout, rank)  # Horovod: its sets
        self.channel = Channel(self.group)  # the blocks' activations' sums

    def shard(self, model: keras.Model) -> keras.Model:
        """`model` (whole, the same on every rank) with its encoder blocks replaced by this
        rank's slices of them: a clone, every other layer as it was."""
        def clone(layer):
            if isinstance(layer, EncoderBlock):
                return ParallelEncoderBlock(layer.spec, self.layout.tensor, self.channel, name=layer.name)
            return layer.__class__.from_config(layer.get_config())

        split = keras.models.clone_model(model, clone_function=clone)
        whole = {v.path: v for v in model.variables}
        assert [v.path for v in split.variables] == list(whole)  # the checkpoints' order holds
        for variable in split.variables:
            variable.assign(plan.split_entry(variable.path, whole[variable.path].numpy(), self.layout.tensor, self.t))
        return split

    def broadcast(self, variables: list) -> None:
        """Replica 0's variables to the other replicas, each rank's from the one holding its slice."""
        if self.layout.replicas > 1:
            hvd.broadcast_variables(tf_variables(variables), self.data_root, process_set=self.data_set)  # Horovod

    def gather(self, entries: list[Entry]) -> dict[str, np.ndarray]:
        """Every entry whole (its key: the array), from the tensor group's slices (a collective
        of the group: every rank of it calls, each gets the whole)."""
        gathered = {}
        for key, path, variable in entries:
            value = np.asarray(variable) if isinstance(variable, (np.ndarray, np.generic)) else variable.numpy()
            if path is None or plan.rule_of(path) is None:
                gathered[key] = value
                continue
            flat = hvd.allgather(tf.reshape(value, [1, -1]), name=f"tp_gather_{key}",
                                 process_set=self.group).numpy()  # Horovod: (T, n), in tensor-rank order
            gathered[key] = plan.join_entry(path, [row.reshape(value.shape) for row in flat])
        return gathered

    def norm_shares(self, variables: list) -> list[float]:
        """Per variable (by its Keras path), its squares' share of the global gradient norm when
        the group sums every rank's (plan.norm_share)."""
        return [plan.norm_share(v.path, self.layout.tensor) for v in variables]

    def clip_by_global_norm(self, grads: list, variables: list, clip: float) -> list:
        """tf.clip_by_global_norm's rule over the whole model, given this rank's slices: the
        norm one process would compute (the slices' squares summed over the group, the whole
        variables' counted once), so every rank of the group scales alike and the variables it
        holds whole stay equal across it."""
        squares = tf.add_n([share * tf.reduce_sum(tf.square(tf.cast(g, tf.float32)))
                            for share, g in zip(self.norm_shares(variables), grads)])
        norm = tf.sqrt(hvd.allreduce(squares, op=hvd.Sum, name="tp_grad_norm", process_set=self.group))  # Horovod
        scale = clip / tf.maximum(norm, clip)
        return [g * tf.cast(scale, g.dtype) for g in grads]

    def cut(self, path: str, value: np.ndarray) -> np.ndarray:
        """This rank's slice of the whole array of the variable at `path`."""
        return plan.split_entry(path, value, self.layout.tensor, self.t)

    def take_whole(self, state: dict, entries: list[Entry]) -> None:
        """Rank 0, reading a checkpoint: keep its whole arrays for `deal`, and cut `state`'s in
        place to this rank's slices (what the backend and the strategy then assign)."""
        self.whole = {key: state[key] for key, _, _ in entries if key in state}
        for key, path, _ in entries:
            if key in state:
                state[key] = plan.split_entry(path or "", state[key], self.layout.tensor, self.t)

    def spread(self, entries: list[Entry], whole: Optional[dict[str, np.ndarray]]) -> None:
        """Every rank's slices of rank 0's whole arrays where rank 0 read them (`whole`, by the
        entries' keys; None elsewhere), else replica 0's to the other replicas (a collective)."""
        if hvd.broadcast_object(whole is not None, root_rank=0, name="tp.spread"):  # Horovod
            self.whole = whole
            self.deal(entries)
        elif self.layout.replicas > 1:
            hvd.broadcast_variables([v for _, _, v in entries], self.data_root, process_set=self.data_set)  # Horovod

    def dealing(self) -> bool:
        """Whether rank 0 read a checkpoint to deal (a collective)."""
        return bool(hvd.broadcast_object(self.whole is not None, root_rank=0, name="tp.dealing"))  # Horovod

    def deal(self, entries: list[Entry]) -> None:
        """After `take_whole` on rank 0: every rank's slices of its whole arrays, broadcast whole
        over the world and cut by each rank (a collective)."""
        whole, tensor = self.whole, self.layout.tensor
        for key, path, variable in entries:
            path = path or ""  # not a slot: whole everywhere
            rule, shape = plan.rule_of(path), list(variable.shape)
            if rule is not None:
                shape[rule.axis] *= tensor
            buffer = tf.convert_to_tensor(whole[key] if whole is not None else np.zeros(shape), variable.dtype)
            value = hvd.broadcast(buffer, 0, name=f"tp_deal_{key}").numpy()  # Horovod
            variable.assign(plan.split_entry(path, value, tensor, self.t))
        self.whole = None


def model_entries(model: keras.Model) -> list[Entry]:
    """The checkpoint's model entries (tf_backend/backend.py's keys), each cut by its own path."""
    return [(f"model/{i}", v.path, v) for i, v in enumerate(model.variables)]


def entries(model: keras.Model, optimizer: Any) -> list[Entry]:
    """The checkpoint's entries (tf_backend/backend.py's keys) with the model path that cuts
    each: a model variable's own, an optimizer slot's variable's (None: whole everywhere)."""
    paths = [v.path for v in model.variables]
    return model_entries(model) + [(f"optimizer/{i}", plan.slot_owner(v.name, paths), v)
                                   for i, v in enumerate(optimizer.variables)]


def build(model: keras.Model, config: Config) -> tuple[keras.Model, Optional[TensorParallel]]:
    """parallel.tensor > 1: every rank takes rank 0's whole model (the ranks must split the same
    one), then keeps its slices of the blocks. Else the model as it is, and None."""
    if config.parallel.tensor == 1:
        return model, None
    hvd.broadcast_variables(tf_variables(model.variables), root_rank=0)  # Horovod
    parallel = TensorParallel(plan.Layout(hvd.size(), config.parallel.tensor), hvd.rank())
    return parallel.shard(model), parallel
