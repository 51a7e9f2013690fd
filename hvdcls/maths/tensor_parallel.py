"""parallel.tensor's layout and weight split, framework-free (the backends' tensor-parallel
blocks follow it; docs/parallelism.md).

Layout: the np ranks form np/T replicas of T ranks each; consecutive ranks form a tensor group
(ranks 0..T-1 the first), so that a group stays on one host where the hosts allow. Rank r holds
slice r % T of every split weight, in replica r // T. The ranks that hold the same slice
(equal r % T, one per replica) form that slice's data-parallel set: the gradients are averaged
over it, as data parallelism averages them over the world.

Split (Megatron-LM's, for a ViT encoder block, torchvision's names): the attention's fused QKV
projection and the MLP's first layer split by output rows ("column parallel": rank t computes
its heads, its hidden units), the attention's output projection and the MLP's second layer by
input columns ("row parallel": each rank's partial product, summed by one all-reduce). The
biases of the row-split layers are added once, after that sum, so they stay whole on every
rank; so do the LayerNorms. A checkpoint keeps the unsharded layout under torchvision's own
keys: `split_state` cuts it for a rank, `join_states` puts the ranks' slices back.

The TensorFlow ViT (tf_backend/vit.py) is cut alike under its Keras variable paths
(`TF_RULES`): Keras' MultiHeadAttention keeps Q, K and V apart, per head, so each is cut by its
heads axis; its Dense kernels are (in, out), the transpose of torch's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from hvdcls.errors import UserError

# torchvision's EncoderBlock: `encoder.layers.encoder_layer_N.` then one of these
BLOCK_KEY = re.compile(r"^(?:.*\.)?encoder\.layers\.encoder_layer_\d+\.(?P<entry>.+)$")
# tf_backend/vit.py's EncoderBlock: the Keras variable path `encoder_layer_N/` then one of TF_RULES'
TF_BLOCK_KEY = re.compile(r"^(?:.*/)?encoder_layer_\d+/(?P<entry>.+)$")


@dataclass(frozen=True)
class Rule:
    """How one weight of a block is cut: along `axis` (torch's 0: output rows, 1: input columns), in
    `parts` equal consecutive parts each cut alike (3 for the fused Q, K and V), so that rank t
    takes the t-th of T pieces of every part."""

    axis: int
    parts: int = 1


COLUMN_PARALLEL_QKV, COLUMN_PARALLEL, ROW_PARALLEL = Rule(0, 3), Rule(0), Rule(1)
RULES = {
    "self_attention.in_proj_weight": COLUMN_PARALLEL_QKV,  # (3h, h): Q, K, V rows, each by heads
    "self_attention.in_proj_bias": COLUMN_PARALLEL_QKV,
    "self_attention.out_proj.weight": ROW_PARALLEL,  # (h, h): by input columns (the heads' outputs)
    "mlp.0.weight": COLUMN_PARALLEL,  # (mlp, h): by hidden units
    "mlp.0.bias": COLUMN_PARALLEL,
    "mlp.3.weight": ROW_PARALLEL,  # (h, mlp): by input columns (the hidden units)
}  # every other entry (LayerNorms, the row-split layers' biases, outside the blocks) is whole
BY_HEADS, BY_ROWS = Rule(1), Rule(0)
TF_RULES = {
    **{f"self_attention/{p}/kernel": BY_HEADS for p in ("query", "key", "value")},  # (h, heads, head_dim)
    **{f"self_attention/{p}/bias": BY_ROWS for p in ("query", "key", "value")},  # (heads, head_dim)
    "self_attention/attention_output/kernel": BY_ROWS,  # (heads, head_dim, h): by its input heads
    "mlp_1/kernel": Rule(1),  # (h, mlp): by hidden units
    "mlp_1/bias": BY_ROWS,
    "mlp_2/kernel": BY_ROWS,  # (mlp, h): by input rows (the hidden units)
}  # as torch's: the LayerNorms and the row-split layers' biases stay whole

Concatenate = Callable[[list, int], Any]  # (pieces, axis) -> one array or tensor


def numpy_cat(pieces: list, axis: int) -> np.ndarray:
    return np.concatenate(pieces, axis)


@dataclass(frozen=True)
class Layout:
    """np = `size` ranks, T = `tensor` ranks a replica."""

    size: int
    tensor: int

    def __post_init__(self):
        if self.tensor < 1:
            raise UserError(f"config parallel.tensor={self.tensor}: must be >= 1")
        if self.size % self.tensor:
            raise UserError(f"config parallel.tensor={self.tensor} does not divide the {self.size} "
                            "ranks into replicas: launch a multiple of it")

    @property
    def replicas(self) -> int:
        return self.size // self.tensor

    def replica(self, rank: int) -> int:
        return rank // self.tensor

    def tensor_rank(self, rank: int) -> int:
        """Which slice rank `rank` holds."""
        return rank % self.tensor

    def group(self, rank: int) -> tuple[int, ...]:
        """The tensor group of `rank`: its replica's T consecutive ranks."""
        first = self.replica(rank) * self.tensor
        return tuple(range(first, first + self.tensor))

    def data_set(self, rank: int) -> tuple[int, ...]:
        """The ranks holding the same slice as `rank`, one per replica."""
        return tuple(range(self.tensor_rank(rank), self.size, self.tensor))

    def process_sets(self) -> list[tuple[int, ...]]:
        """Every set a rank may use but the whole world (Horovod's global set), in one order
        for every rank (Horovod: every rank creates every set, in the same order): the tensor
        groups, then the data-parallel sets; each once."""
        every = [self.group(r * self.tensor) for r in range(self.replicas)]
        every += [self.data_set(t) for t in range(self.tensor)]
        whole = tuple(range(self.size))
        return list(dict.fromkeys(s for s in every if s != whole))


def check_heads(tensor: int, heads: int, model: str) -> None:
    if heads % tensor:
        raise UserError(f"config parallel.tensor={tensor} does not divide {model}'s {heads} attention "
                        "heads: the heads are what the ranks share out")


def rule_of(key: str) -> Optional[Rule]:
    """How the entry `key` of a state dict is cut; None: it is whole on every rank."""
    match = BLOCK_KEY.match(key)
    if match:
        return RULES.get(match.group("entry"))
    match = TF_BLOCK_KEY.match(key)
    return TF_RULES.get(match.group("entry")) if match else None


def slot_owner(name: str, paths: Sequence[str]) -> Optional[str]:
    """The model variable (of `paths`) a Keras 3 optimizer variable named `name` is a slot of:
    Keras names it `{path with "/" as "_"}_{slot}` (momentum, velocity); None: not a slot
    (the iteration count, the learning rate), whole everywhere."""
    owners = [p for p in paths if name.startswith(p.replace("/", "_") + "_")]
    return max(owners, key=len) if owners else None


def _piece(length: int, parts: int, tensor: int, key: str) -> int:
    if length % (parts * tensor):
        raise ValueError(f"{key}: {length} does not split into {parts} x {tensor} equal pieces")
    return length // (parts * tensor)


def split_entry(key: str, value: Any, tensor: int, t: int, cat: Concatenate = numpy_cat) -> Any:
    """Rank t's slice of the state entry `key` (a numpy array; a tensor with its framework's `cat`)."""
    rule = rule_of(key)
    if rule is None or tensor == 1:
        return value
    piece = _piece(value.shape[rule.axis], rule.parts, tensor, key)
    part = piece * tensor
    index = [slice(None)] * len(value.shape)
    pieces = []
    for k in range(rule.parts):
        index[rule.axis] = slice(k * part + t * piece, k * part + (t + 1) * piece)
        pieces.append(value[tuple(index)])
    return pieces[0] if rule.parts == 1 else cat(pieces, rule.axis)


def join_entry(key: str, slices: Sequence[Any], cat: Concatenate = numpy_cat) -> Any:
    """The whole entry `key` from every rank's slice, in tensor-rank order."""
    rule = rule_of(key)
    if rule is None or len(slices) == 1:
        return slices[0]
    piece = slices[0].shape[rule.axis] // rule.parts
    index = [slice(None)] * len(slices[0].shape)
    parts = []
    for k in range(rule.parts):
        index[rule.axis] = slice(k * piece, (k + 1) * piece)
        parts.append(cat([s[tuple(index)] for s in slices], rule.axis))
    return parts[0] if rule.parts == 1 else cat(parts, rule.axis)


def split_state(state: dict, tensor: int, t: int, cat: Concatenate = numpy_cat) -> dict:
    """Rank t's state dict from a whole one (the keys unchanged, the split entries cut)."""
    return {key: split_entry(key, value, tensor, t, cat) for key, value in state.items()}


def join_states(states: Sequence[dict], cat: Concatenate = numpy_cat) -> dict:
    """The whole state dict from the T ranks' (in tensor-rank order), torchvision's layout."""
    return {key: join_entry(key, [s[key] for s in states], cat) for key in states[0]}


def split_fraction(state: dict, tensor: int) -> float:
    """The share of a whole state's elements one rank holds at `tensor` (the replicated ones
    counted whole): what the memory per rank should come to."""
    whole = sum(int(np.prod(v.shape)) for v in state.values())
    held = sum(int(np.prod(v.shape)) // (tensor if rule_of(k) else 1) for k, v in state.items())
    return held / whole


def norm_share(key: str, tensor: int) -> float:
    """What the entry `key`'s squares count for in the global gradient norm when every rank of a
    tensor group adds its own and the group sums them: a slice's once, a whole entry (the same
    on each of the T ranks) 1/T of them, so that the sum counts it once."""
    return 1.0 if rule_of(key) is not None else 1.0 / tensor


BUILT_FOR = ("torch", "tensorflow")


def check_run(tensor: int, backend: str, size: int) -> Layout:
    """At the run's start, on every rank (the world size known): the layout, or one line."""
    if tensor > 1 and backend not in BUILT_FOR:
        raise UserError(f"config parallel.tensor={tensor}: parallel.tensor>1 is built for {' and '.join(BUILT_FOR)}")
    return Layout(size, tensor)
