"""training.zero for the TensorFlow backend: ShardedOptimizer, in place of the all-reduced update.

Mirror: torch_backend/zero.py (the same plan, hvdcls.maths.zero, and the same collectives). The
trained variables lie in flat buckets; each rank owns one contiguous 1/N slice of every bucket
and keeps a Keras optimizer over its slices alone (one flat variable per bucket), so its slots
(momentum, Adam's moments) are 1/N of the unsharded ones. `apply(grads)`, inside the compiled
step, takes this rank's local gradients: zero=1 all-reduces the flat buckets and keeps its
slice, zero=2 reduce-scatters them; the slices are stepped (L2 and clipping as the backend's
_apply does them: the global norm summed over the ranks' slices) and all-gathered back into the
variables. One bucket at a time, as in torch: each bucket's flat copy is made only once the
bucket before it is reduced (control dependencies; the graph would otherwise make them all at
once), and the all-gather of a bucket waits for the previous bucket's variables to be written,
so a step holds one flat bucket beyond the gradients and the slices, not a second copy of all.
SGD, Adam and AdamW act element by element, so stepping a slice is stepping those elements; the
padding stays zero and is dropped.

Checkpoints: where every rank sees the checkpoint directory, each rank writes its own slices
(the local optimizer's variables) to a file there (hvdcls.maths.zero.shard_file_name) and a resume
reads them back, re-sharding when the world size changed (hvdcls.maths.zero.sources). Elsewhere they
hold the unsharded optimizer's variables: a Keras optimizer built on the model lists
`iteration` and `learning_rate`, then each variable's slots in order (momentum, velocity), which
`gather()` rebuilds from the slices (a collective) and `load_full()` cuts them from.
"""
from __future__ import annotations

import os
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.maths.zero import Bucket, fill_from, find_shards, own_shard, plan, shard_file_name

SLICE = "zero_slice"
SHARD_SUFFIX = ".npz"
IN_SHARD_FILES = "zero_shard_files"  # the checkpoint's key when every rank saved its own slices


class ShardedOptimizer:
    def __init__(self, variables: list, make_optimizer: Callable[[], keras.optimizers.Optimizer],
                 level: int, fp16: bool = False, l2: float = 0.0, clip: Optional[float] = None,
                 buckets: Optional[list[Bucket]] = None, slices: Optional[list[np.ndarray]] = None,
                 process_set: Any = None, norm_shares: Optional[list[float]] = None):
        """`buckets`: the plan's by default (zero=3 gives its blocks', and `slices`, the
        shards' first values: their variables are whole nowhere by then). `process_set`: the
        ranks it shards over and averages across (every rank by default; parallel.tensor: those
        holding the same slices); `norm_shares`: per variable, its squares' share of the global
        gradient norm (parallel.tensor's plan.norm_share; None: 1 each)."""
        self.variables, self.level, self.fp16, self.l2, self.clip = variables, level, fp16, l2, clip
        self.set = process_set if process_set is not None else hvd.global_process_set  # Horovod
        self.rank, self.size = self.set.rank(), self.set.size()
        # A set of one rank has nobody to reduce with: no collective. Horovod 0.28.1's TF ops on
        # a process set of one rank failed now and then (tf_backend/strategies/plain.py).
        self.alone = self.size == 1
        self.norm_shares = norm_shares
        self.sizes = [int(np.prod(v.shape)) for v in variables]
        self.buckets = buckets or plan(self.sizes, self.size)
        self.shards = [self._shard(i, b, slices) for i, b in enumerate(self.buckets)]
        self.local = make_optimizer()
        self.local.build(self.shards)
        self.scalars, self.kinds = self._layout()
        self.gathered: Optional[list] = None  # the unsharded optimizer's arrays, from gather()
        self.loaded: Optional[list | dict] = None  # what load_full() read (or the shards' directory)
        self.in_files = False  # write_shard() wrote this rank's slices for the coming save()

    @staticmethod
    def _shard(i: int, bucket: Bucket, slices: Optional[list]) -> keras.Variable:
        """Bucket i's slice as a variable (zeros, or zero=3's first values, each dropped from
        `slices` once copied: TensorFlow keeps the whole model's freed memory for its own
        tensors, so the NumPy copies would add 2 GB a rank to ViT-g/14's build)."""
        value = np.zeros(bucket.shard, np.float32) if slices is None else slices[i]
        if slices is not None:
            slices[i] = None
        # autocast off: zero=3 reads them inside a layer's call, where mixed precision would cast
        return keras.Variable(value, name=f"{SLICE}_{i}", autocast=False)

    def _layout(self) -> tuple[int, list[str]]:
        """(0-d variables first, slot kinds per variable), checked against the local optimizer's
        names: `zero_slice_B_KIND`, bucket by bucket."""
        names = [v.name for v in self.local.variables]
        scalars = sum(1 for v in self.local.variables if len(v.shape) == 0)
        per = (len(names) - scalars) // len(self.shards)
        kinds = [names[scalars + k].removeprefix(f"{SLICE}_0_") for k in range(per)]
        expected = [f"{SLICE}_{b}_{k}" for b in range(len(self.shards)) for k in kinds]
        if names[scalars:] != expected:
            raise UserError(f"training.zero: {type(self.local).__name__}'s variables are not laid out "
                            "per variable and slot as expected; use training.zero=0")
        return scalars, kinds

    def slot(self, b: int, k: int):
        return self.local.variables[self.scalars + b * len(self.kinds) + k]

    def _flat(self, bucket: Bucket, tensors) -> tf.Tensor:
        flat = tf.concat([tf.reshape(tf.cast(tensors[i], tf.float32), [-1]) for i in bucket.params], 0)
        return tf.pad(flat, [[0, bucket.padded - bucket.numel]])

    def _own(self, bucket: Bucket, tensors) -> tf.Tensor:
        """This rank's slice of `tensors` (one per variable), flat, padded with zeros."""
        parts = [tf.reshape(tf.cast(tensors[p.param], tf.float32), [-1])[p.start:p.end]
                 for p in bucket.pieces(self.rank)]
        owned = sum(p.end - p.start for p in bucket.pieces(self.rank))
        return tf.concat([*parts, tf.zeros([bucket.shard - owned], tf.float32)], 0)

    def apply(self, grads: list) -> None:
        """Horovod: average `grads` (this rank's, one per variable) by slices, step them, gather."""
        slices = self._reduce(grads)
        weights = tf_values(self.variables)
        for bucket, shard in zip(self.buckets, self.shards):
            shard.assign(self._own(bucket, weights))  # the variables may have been set (resume)
        self.step_slices(slices)
        written: list = []
        for b, (bucket, shard) in enumerate(zip(self.buckets, self.shards)):
            with tf.control_dependencies(written):  # the previous bucket is in the variables
                flat = shard.value if self.alone else hvd.allgather(  # Horovod: in rank order
                    shard.value, name=f"zero.params.{b}", process_set=self.set)
            written = [self._write(i, flat[offset:offset + size])
                       for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes)]

    def step_slices(self, slices: list) -> None:
        """The local optimizer's step on this rank's slices of the averaged gradients."""
        if self.l2:  # as the backend's _apply: L2 on the averaged gradient
            slices = [g + self.l2 * s.value for g, s in zip(slices, self.shards)]
        if self.clip:
            slices = self._clip(slices)
        self.local.apply_gradients(zip(slices, self.shards))

    def _write(self, i: int, flat: tf.Tensor):
        v = self.variables[i]
        return v.assign(tf.cast(tf.reshape(flat, v.shape), v.dtype))

    def _reduce(self, grads: list) -> list:
        """This rank's slice of the ranks' averaged gradients, bucket by bucket."""
        slices: list = []
        for b, bucket in enumerate(self.buckets):
            with tf.control_dependencies(slices[-1:]):  # made once the bucket before is reduced
                flat = self._flat(bucket, grads)
            if self.fp16:  # horovod.compression=fp16: the reduction travels in float16
                flat = tf.cast(flat, tf.float16)
            if self.alone:
                part = flat
            elif self.level == 1:
                averaged = hvd.allreduce(flat, op=hvd.Average, name=f"zero.grads.{b}", process_set=self.set)
                part = averaged[slice(*bucket.slice(self.rank))]
            else:  # equal slices (padded), so Horovod's split hands rank r its own
                part = hvd.reducescatter(flat, op=hvd.Average, name=f"zero.grads.{b}", process_set=self.set)
            slices.append(tf.cast(part, tf.float32))
        return slices

    def _clip(self, slices: list) -> list:
        """tf.clip_by_global_norm's rule, the norm over every rank's slices."""
        if self.norm_shares is None:
            squares = tf.add_n([tf.reduce_sum(tf.square(s)) for s in slices])
        else:  # each variable's squares counted by its share
            shares = self.norm_shares
            squares = tf.add_n([shares[p.param] * tf.reduce_sum(tf.square(s[p.offset:p.offset + p.end - p.start]))
                                for bucket, s in zip(self.buckets, slices) for p in bucket.pieces(self.rank)])
        norm = tf.sqrt(hvd.allreduce(squares, op=hvd.Sum, name="zero.grad_norm"))
        scale = self.clip / tf.maximum(norm, self.clip)
        return [s * scale for s in slices]

    def held_grad_bytes(self) -> int:
        """Gradients held per step (Backend.memory): zero=2 the slices only; zero=1 the local
        gradients and the averaged slices."""
        sliced = 4 * sum(b.shard for b in self.buckets)
        return sliced if self.level >= 2 else sliced + sum(
            n * tf.as_dtype(v.dtype).size for n, v in zip(self.sizes, self.variables))

    # The checkpoint's (unsharded) layout: the 0-d variables, then per variable its slots.

    def full_length(self) -> int:
        return self.scalars + len(self.variables) * len(self.kinds)

    def gather(self) -> None:
        """Horovod: every rank calls it; the unsharded arrays, for rank 0's save (which drops them)."""
        arrays: list = [v.numpy() for v in self.local.variables[:self.scalars]]
        per_param: dict = {}
        for b, bucket in enumerate(self.buckets):
            slots = [self.slot(b, k).value for k in range(len(self.kinds))]
            if self.alone or not slots:
                full = slots
            else:
                full = hvd.grouped_allgather(slots, name=f"zero.state.{b}", process_set=self.set)
            for k, flat in enumerate(full):
                flat = flat.numpy()
                for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes):
                    per_param[(i, k)] = flat[offset:offset + size].reshape(self.variables[i].shape)
        arrays += [per_param[(i, k)] for i in range(len(self.variables)) for k in range(len(self.kinds))]
        self.gathered = arrays if self.rank == 0 else None  # only rank 0 saves: no copy kept elsewhere

    def shard_arrays(self) -> dict[str, np.ndarray | Callable[[], np.ndarray]]:
        """What write_shard() writes, by name (`slot/B/K` and `param/B`: slices of bucket B)."""
        arrays: dict[str, np.ndarray | Callable[[], np.ndarray]] = {
            "numels": np.array([b.numel for b in self.buckets], np.int64)}
        arrays.update({f"scalar/{i}": v.numpy for i, v in enumerate(self.local.variables[:self.scalars])})
        arrays.update({f"slot/{b}/{k}": self.slot(b, k).numpy  # one host copy at a time
                       for b in range(len(self.buckets)) for k in range(len(self.kinds))})
        return arrays

    def write_shard(self, directory: Path) -> None:
        """This rank's slices (the local optimizer's variables) to its file in `directory`."""
        arrays = self.shard_arrays()
        final = directory / shard_file_name(self.rank, self.size, SHARD_SUFFIX)
        tmp = final.with_name(f".{final.name}.tmp")
        with fileio.large_output(tmp) as handle:
            fileio.savez_one_at_a_time(handle, arrays)
        os.replace(tmp, final)
        self.in_files = True  # rank 0's save() says so in the checkpoint

    def read_shards(self, directory: Path, buckets: list[Bucket], rank: int) -> dict[str, np.ndarray]:
        """`rank`'s slices of `buckets` (at their world size), by write_shard()'s names, from the
        shard files every rank of the saving run wrote: its own at the same world size (bit-
        identical), else the overlapping parts of each old slice, one file at a time."""
        own = own_shard(directory, SHARD_SUFFIX, rank, buckets[0].world)
        if own is not None:
            return self._read_shard(own, buckets)
        files = find_shards(directory, SHARD_SUFFIX)
        if files is None:
            raise UserError(f"checkpoint {directory}: training.zero shard files expected, none found")
        out: dict[str, np.ndarray] = {}
        for source, path in enumerate(files):
            old = self._read_shard(path, buckets)
            for name, value in old.items():
                if not name.startswith(("slot/", "param/")):
                    out.setdefault(name, value)  # the iteration count: the same on every rank
                    continue
                bucket = buckets[int(name.split("/")[1])]
                if name not in out:  # made once, not per old file: it is a whole slice
                    out[name] = np.zeros(bucket.shard, value.dtype)
                fill_from(out[name], value, bucket, len(files), rank, source)
        return out

    def _read_shard(self, path: Path, buckets: list[Bucket]) -> dict[str, np.ndarray]:
        with _opened(path, buckets) as stored:
            return {k: _member(path, stored, k) for k in stored.files if k != "numels"}

    def load_shards_from(self, directory: Path) -> None:
        """Rank 0: the checkpoint's optimizer state is in shard files (follow with broadcast_state())."""
        self.loaded = {IN_SHARD_FILES: str(directory)}

    def _load_shards(self, directory: Path) -> None:
        """Every rank reads its slices; one that cannot stops every rank, with its reason. At the
        world size that wrote them, one array at a time from this rank's own file, each assigned
        as it is read (a whole file's arrays beside the built state killed the resume of
        TensorFlow's ViT-H/14 at zero=3); at another, re-cut from every rank's file."""
        error = None
        try:
            own = own_shard(directory, SHARD_SUFFIX, self.rank, self.buckets[0].world)
            if own is None:
                self.assign_shard_arrays(self.read_shards(directory, self.buckets, self.rank))
            else:
                with _opened(own, self.buckets) as stored:
                    self.assign_shard_arrays(_Members(own, stored))
        except UserError as err:
            error = f"rank {self.rank}: {err}"
        errors = [e for e in hvd.allgather_object(error, name="zero.shards_read") if e]
        if errors:
            raise UserError(errors[0])

    def assign_shard_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        for i, v in enumerate(self.local.variables[:self.scalars]):
            v.assign(arrays[f"scalar/{i}"])
        for b in range(len(self.buckets)):
            for k in range(len(self.kinds)):
                self.slot(b, k).assign(arrays[f"slot/{b}/{k}"])

    def load_full(self, arrays: list) -> None:
        self.cut(arrays)
        self.loaded = arrays

    def broadcast_state(self) -> None:
        """Horovod: rank 0's loaded checkpoint, every rank cutting its slices; else rank 0's
        (fresh, equal) state is every rank's already."""
        full = hvd.broadcast_object(self.loaded if hvd.rank() == 0 else None, root_rank=0,
                                    name="zero.optimizer")
        if isinstance(full, dict):
            self._load_shards(Path(full[IN_SHARD_FILES]))
        elif full is not None:
            self.cut(full)
        self.loaded = None

    def cut(self, arrays: list) -> None:
        """This rank's slices of the unsharded optimizer's arrays (any world size wrote them)."""
        for v, value in zip(self.local.variables[:self.scalars], arrays):
            v.assign(value)
        for b, bucket in enumerate(self.buckets):
            for k in range(len(self.kinds)):
                per_variable = {i: arrays[self.scalars + i * len(self.kinds) + k] for i in bucket.params}
                self.slot(b, k).assign(self._own(bucket, per_variable))


@contextmanager
def _opened(path: Path, buckets: list[Bucket]) -> Iterator[Any]:
    """A shard file, open, once its buckets are checked to be `buckets` (one line if not)."""
    try:
        stored = np.load(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"cannot load {path}: {err or type(err).__name__}") from None
    with stored:
        if _member(path, stored, "numels").tolist() != [b.numel for b in buckets]:
            raise UserError(f"cannot load {path}: its training.zero buckets are not this model's")
        yield stored


def _member(path: Path, stored: Any, name: str) -> np.ndarray:
    try:
        return stored[name]
    except KeyError:
        raise UserError(f"cannot load {path}: it holds no {name!r}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise UserError(f"cannot load {path}: {err or type(err).__name__}") from None


class _Members(Mapping[str, np.ndarray]):
    """A shard file's arrays by name, each read when it is looked up."""

    def __init__(self, path: Path, stored: Any):
        self.path, self.stored = path, stored

    def __getitem__(self, name: str) -> np.ndarray:
        return _member(self.path, self.stored, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.stored.files)

    def __len__(self) -> int:
        return len(self.stored.files)


def tf_values(variables) -> dict:
    return {i: v.value for i, v in enumerate(variables)}
