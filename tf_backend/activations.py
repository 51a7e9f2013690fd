"""What a training step's forward keeps for its backward (hvdcls bench's activation memory,
Backend.saved_activation_bytes), read from the step's traced graph.

TensorFlow has no hook on the tensors a step keeps: tf.function builds the forward and, under
GradientTape, the backward as one graph and frees a tensor once its last consumer has run. So
what the forward keeps for backward is what the backward reads from the forward: the inputs,
produced by no backward op, of the ops the tape made (named under `gradient_tape/`) and of
the ops between theirs (a recomputed block's forward among them).
A tensor counts once, its views (Reshape, Identity, ...) as the tensor they alias; the
variables' values (the parameters) and constants not at all, as torch's count leaves out the
parameters. tf.recompute_grad's blocks recompute inside the backward, so only their inputs
count, as torch's checkpointed blocks.

Mirror: torch_backend/activations.py.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

BACKWARD_SCOPE = "gradient_tape/"  # the name scope of the ops GradientTape.gradient adds
# ops whose output is their input's buffer: counted as that input
ALIASES = frozenset({"Identity", "IdentityN", "Reshape", "ExpandDims", "Squeeze", "StopGradient", "Snapshot"})
NOT_ACTIVATIONS = frozenset({"Const", "ReadVariableOp", "VarHandleOp", "Shape", "Size", "Rank"})


def backward_ops(graph: tf.Graph) -> set:
    """The ops of the gradients' computation: those the tape made, and those between them (a
    recomputed block's forward: computed from theirs, read by theirs). Not what reads the
    gradients only (their sums, the all-reduces, the update)."""
    made = [op for op in graph.get_operations() if op.name.startswith(BACKWARD_SCOPE)]
    return closure(made, lambda op: (c for out in op.outputs for c in out.consumers())) & \
        closure(made, lambda op: (t.op for t in op.inputs))


def closure(start: list, neighbours) -> set:
    """`start` and every op reached from it through `neighbours`."""
    seen, frontier = set(start), list(start)
    while frontier:
        for op in neighbours(frontier.pop()):
            if op not in seen:
                seen.add(op)
                frontier.append(op)
    return seen


def aliased(tensor: tf.Tensor) -> tf.Tensor:
    """The tensor whose buffer `tensor` is (itself unless a view of another)."""
    while tensor.op.type in ALIASES and tensor.op.inputs:
        tensor = tensor.op.inputs[min(tensor.value_index, len(tensor.op.inputs) - 1)]
    return tensor


def saved_bytes(graph: tf.Graph) -> Optional[int]:
    """The bytes the forward of the training step traced in `graph` keeps for its backward;
    None where the graph has no backward of its own (an XLA-compiled gradient is a nested
    function) or a kept tensor's shape is not known."""
    backward = backward_ops(graph)
    if not backward:
        return None
    kept: dict = {}
    for op in backward:
        for tensor in (aliased(t) for t in op.inputs if t.op not in backward):
            # (a view's tensor is outside the backward too: its own view would be a backward op)
            if (tensor.op.type in NOT_ACTIVATIONS or tensor.dtype == tf.resource
                    or tensor.shape.rank == 0):  # a scalar (a factor such as the loss scale): no activation
                continue
            if not tensor.shape.is_fully_defined():
                return None
            kept[tensor.ref()] = tensor.shape.num_elements() * tensor.dtype.size
    return sum(kept.values())
