"""training.zero for the PyTorch backend: ShardedOptimizer, in place of hvd.DistributedOptimizer.

Mirror: tf_backend/zero.py. The parameters lie in flat buckets (hvdcls.maths.zero.plan); each rank
owns one contiguous 1/N slice of every bucket and keeps a plain local optimizer over its slices
alone (one flat tensor per bucket), so its state (momentum, Adam's moments) is 1/N of the
unsharded one. A step: the gradients are averaged bucket by bucket (zero=1: an all-reduce of
the flat bucket, each rank keeping its slice; zero=2: a reduce-scatter, and the bucket's full
gradients are freed), each bucket's started by the gradient hooks as soon as backward has made
all of its gradients, so that it crosses while backward goes on (the train step arms them for
its last pass); synchronize() waits for them; step() steps the slices and all-gathers them back into the
parameters, bucket by bucket (so what a step adds to the model's tensors is one bucket).
SGD, Adam and AdamW act element by element, so stepping a slice is stepping those elements;
padding (zero gradient, zero weight) stays zero and is dropped.

It answers what the backend asks of DistributedOptimizer (param_groups, zero_grad,
synchronize, skip_synchronize, step, state_dict, load_state_dict), so the train step is the
same code. Checkpoints: where every rank sees the checkpoint directory, each rank writes its
own slices' state to a file there (hvdcls.maths.zero.shard_file_name) and a resume reads them back,
re-sharding when the world size changed (hvdcls.maths.zero.sources); elsewhere prepare_checkpoint()
gathers the unsharded optimizer's state_dict to rank 0 (a collective) and load_state_dict()
cuts this rank's slices out of one, whatever world size wrote it.
"""
from __future__ import annotations

import os
from collections import deque
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import horovod.torch as hvd
import torch

from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.horovod_backend import sleep_until_done
from hvdcls.maths.zero import BUCKET_ELEMENTS, Bucket, fill_from, find_shards, own_shard, plan, shard_file_name

MakeOptimizer = Callable[[list], torch.optim.Optimizer]
SHARD_SUFFIX = ".pt"
IN_FLIGHT = 2  # bucket reductions started before the oldest is waited for
IN_SHARD_FILES = "zero_shard_files"  # torch.pt's "optimizer" when every rank saved its own slices


class ShardedOptimizer:
    def __init__(self, params: list[torch.Tensor], make_optimizer: MakeOptimizer, level: int,
                 fp16: bool = False, bucket_elements: int = BUCKET_ELEMENTS, wait_asleep: bool = False,
                 process_set: Any = None, norm_shares: Optional[list[float]] = None):
        """`process_set`: the ranks it shards over and averages across (every rank by default;
        parallel.tensor: those holding the same slices, hvdcls.strategy's composition);
        `norm_shares`: per parameter, its squares' share of the global gradient norm
        (parallel.tensor's plan.norm_share; None: 1 each)."""
        self.params, self.level, self.fp16 = params, level, fp16
        self.wait_asleep = wait_asleep  # horovod.wait=sleep: nap between polls, not Horovod's spin
        self.set = process_set if process_set is not None else hvd.global_process_set  # Horovod
        self.rank, self.size = self.set.rank(), self.set.size()
        self.norm_shares = norm_shares
        self.buckets = plan([p.numel() for p in params], self.size, bucket_elements)
        self.shards = [torch.zeros(b.shard, dtype=torch.float32, device=params[0].device)
                       for b in self.buckets]
        self.local = make_optimizer(self.shards)
        # Buckets' flat gradients, reduced in place, in buffers kept from step to step: a new
        # tensor of a bucket's size is new memory the kernel faults in page by page (17 ms for
        # 64 MiB on the 2-core test machine), and zero=1 made two a bucket each step (the flat
        # gradients and the all-reduce's result). IN_FLIGHT buckets held through forward and
        # backward, so that a bucket is copied while the one before it is on the wire.
        self.work: list[torch.Tensor] = []  # free buffers, at most IN_FLIGHT made
        self.made_work = 0
        self.bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket.params}
        self.waiting: list[int] = []  # per bucket: gradient hooks yet to fire ([]: not armed)
        self.next_launch = len(self.buckets) - 1  # buckets start in this order: last first
        self.in_flight: deque = deque()  # launched buckets, oldest first: (bucket, handle, flat, sent)
        self.reduced: dict[int, torch.Tensor] = {}  # bucket -> this rank's averaged slice
        for i, p in enumerate(params):
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _, i=i: self._gradient_ready(i))
        self.gathered: Optional[dict] = None  # the unsharded state, from prepare_checkpoint()
        self.loaded: Optional[dict] = None  # an unsharded state load() read, for broadcast_state()

    @property
    def param_groups(self) -> list[dict]:
        return self.local.param_groups

    @property
    def state(self):
        return self.local.state

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for s in self.shards:
            s.grad = None
        self._forget_cut_short()

    def arm(self, passes: int) -> None:
        """The coming step has `passes` backward passes: each bucket's reduction starts inside the
        last pass, once every one of its parameters' gradients is accumulated, and overlaps the
        backward of the layers before it (as DistributedOptimizer's hooks do for zero=0; a
        reduction after backward cost zero=1 6% of zero=0's step on ResNet-50)."""
        self._disarm()
        self.waiting = [passes * len(b.params) for b in self.buckets]

    def _disarm(self) -> None:
        self.waiting, self.next_launch = [], len(self.buckets) - 1

    def _gradient_ready(self, i: int) -> None:
        """A parameter's gradient hook (once per backward pass that reached it)."""
        if not self.waiting:  # not armed: a backward outside train_step (tests, lr_find's probes)
            return
        self.waiting[self.bucket_of[i]] -= 1
        self._start_in_order()

    def _start_in_order(self, everything: bool = False) -> None:
        """Start the buckets not started yet, in the one order, while the next one's gradients
        are all made (or `everything`: backward is over). Every rank starts them in this order,
        the last (the last layers', which backward makes first) first, and waits for them in
        it, whatever order its hooks fire in (a parameter without a gradient on one rank):
        started as they came, a rank waiting for a free buffer could wait for a bucket that the
        other starts only after one it waits for."""
        while self.next_launch >= 0 and (everything or self.waiting[self.next_launch] == 0):
            self._launch(self.next_launch)
            self.next_launch -= 1

    def skip_synchronize(self):
        return nullcontext()  # step() never reduces: synchronize() did

    def _buffer(self) -> torch.Tensor:
        """A free work buffer (the largest bucket's size), at most IN_FLIGHT of them: the oldest
        reduction in flight is finished to free one when none is."""
        if not self.work and self.made_work >= IN_FLIGHT:
            self._finish_oldest()
        if self.work:
            return self.work.pop()
        self.made_work += 1
        largest = max(b.padded for b in self.buckets)
        return torch.empty(largest, dtype=torch.float32, device=self.shards[0].device)

    def _flat_grads(self, bucket: Bucket, work: torch.Tensor) -> torch.Tensor:
        """The bucket's gradients in one padded float32 tensor (the front of `work`), each copied
        once (a cat and then a pad copied the bucket twice)."""
        flat = work[:bucket.padded]
        flat[bucket.numel:].zero_()
        for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes):
            grad = self.params[i].grad
            if grad is None:
                flat[offset:offset + size].zero_()
            else:
                flat[offset:offset + size].copy_(grad.reshape(-1))
        return flat

    @torch.no_grad()
    def _launch(self, b: int) -> None:
        """Start bucket b's reduction: its gradients copied into a work buffer and, at zero=2,
        freed, so a step holds at most IN_FLIGHT buckets more than the gradients, not a
        second copy of them all (grouped over every bucket, ViT-H/14 at np=2 held a second
        2.5 GB a rank; docs/benchmarks.md)."""
        bucket, work = self.buckets[b], self._buffer()
        flat = self._flat_grads(bucket, work)
        if self.level == 2:
            for i in bucket.params:
                self.params[i].grad = None  # zero=2: only the slice's gradients are kept
        sent = flat.half() if self.fp16 else flat  # horovod.compression=fp16: float16 on the wire
        if self.level == 1:
            handle = hvd.allreduce_async_(sent, op=hvd.Average, name=f"zero.grads.{b}", process_set=self.set)
        else:  # equal slices (padded), so Horovod's split is rank r's [r x shard, (r+1) x shard)
            handle = hvd.reducescatter_async(sent, op=hvd.Average, name=f"zero.grads.{b}", process_set=self.set)
        self.in_flight.append((b, handle, work, sent))

    def _finish_oldest(self) -> None:
        b, handle, work, sent = self.in_flight.popleft()
        if self.wait_asleep:
            sleep_until_done([handle], hvd.poll)
        out = hvd.synchronize(handle)
        if self.level == 1:  # a view of the buffer: copied out before the buffer is reused
            part = sent[slice(*self.buckets[b].slice(self.rank))]
            self.reduced[b] = part.float() if self.fp16 else part.clone()
        else:
            self.reduced[b] = out.float()
        self.work.append(work)

    def _forget_cut_short(self) -> None:
        """What a step cut short by an error left (an elastic reset): its buffers may still be
        written by a collective of the old world, so they are dropped, not reused."""
        self.made_work -= len(self.in_flight)
        self.in_flight.clear()
        self.reduced.clear()
        self._disarm()

    @torch.no_grad()
    def synchronize(self) -> None:
        """Horovod: every rank's shard gradients <- its slice of the ranks' average. Buckets the
        hooks did not start (not armed, or a parameter without a gradient) start here, in the
        hooks' order."""
        self._start_in_order(everything=True)
        while self.in_flight:
            self._finish_oldest()
        for b, shard in enumerate(self.shards):
            shard.grad = self.reduced.pop(b)
        self._disarm()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return clip_slices_(self.shards, max_norm, self._squares() if self.norm_shares else None)

    def _squares(self) -> torch.Tensor:
        """This rank's slices' squared gradients, each parameter's counted by its norm share."""
        assert self.norm_shares is not None
        total = torch.zeros((), dtype=torch.float32, device=self.shards[0].device)
        for bucket, shard in zip(self.buckets, self.shards):
            if shard.grad is None:
                continue
            for piece in bucket.pieces(self.rank):
                part = shard.grad[piece.offset:piece.offset + piece.end - piece.start].float()
                total += self.norm_shares[piece.param] * torch.sum(part ** 2)
        return total

    def held_grads(self) -> list[torch.Tensor]:
        """The gradient tensors this rank holds now (Backend.memory)."""
        return [t.grad for t in [*self.params, *self.shards] if t.grad is not None]

    @torch.no_grad()
    def step(self) -> None:
        self._read_slices()  # the parameters may have been set (resume, restore) since the last step
        self.local.step()
        self.gathered = None
        for b, (bucket, shard) in enumerate(zip(self.buckets, self.shards)):  # one bucket at a time
            flat = hvd.allgather(shard, name=f"zero.params.{b}", process_set=self.set)  # Horovod: in rank order
            for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes):
                p = self.params[i]
                p.copy_(flat[offset:offset + size].view_as(p))
            del flat

    def _read_slices(self) -> None:
        for bucket, shard in zip(self.buckets, self.shards):
            for piece in bucket.pieces(self.rank):
                flat = self.params[piece.param].detach().reshape(-1)
                shard[piece.offset:piece.offset + piece.end - piece.start].copy_(flat[piece.start:piece.end])

    # The state: this rank's slices in memory (snapshot/restore), the unsharded optimizer's
    # state_dict in checkpoints.

    def state_dict(self) -> dict:
        """The gathered unsharded state after prepare_checkpoint() (what rank 0 saves), else this
        rank's own (a snapshot); load_state_dict() takes either."""
        return self.gathered if self.gathered is not None else {"zero_shard": self.local.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "zero_shard" in state:
            self.local.load_state_dict(state["zero_shard"])
        else:
            self.local.load_state_dict(self._cut(state))
            self.loaded = state
        self.gathered = None

    def broadcast_state(self) -> None:
        """Horovod: rank 0's loaded checkpoint (the unsharded state), every rank cutting its slices."""
        full = hvd.broadcast_object(self.loaded if hvd.rank() == 0 else None, root_rank=0,
                                    name="zero.optimizer")
        if full is not None and IN_SHARD_FILES in full:
            self._load_shards(Path(full[IN_SHARD_FILES]))
        elif full is not None:
            self.local.load_state_dict(self._cut(full))
        elif not self.local.state:
            self._initial_step()
        self.loaded = None

    def _load_shards(self, directory: Path) -> None:
        """Every rank reads its slices; one that cannot stops every rank, with its reason."""
        try:
            state, error = read_shards(directory, self.buckets, self.rank)["optimizer"], None
        except UserError as err:
            state, error = None, f"rank {self.rank}: {err}"
        errors = [e for e in hvd.allgather_object(error, name="zero.shards_read") if e]
        if errors or state is None:
            raise UserError(errors[0] if errors else f"rank {self.rank}: no shard state read")
        load_mapped_state(self.local, state)

    @torch.no_grad()
    def _initial_step(self) -> None:
        """What hvd.broadcast_optimizer_state does to an optimizer without state, so that zero=0
        and zero>0 train alike: one step on zero gradients at the built rate (weight decay moves
        the weights and fills the momentum; Adam counts a step), by slices here."""
        for shard in self.shards:
            shard.grad = torch.zeros_like(shard)
        self.step()
        for shard in self.shards:
            shard.grad = None

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        """Every rank calls it. With `shard_dir` (seen by every rank) each writes its own slices'
        state there; without, the slices are all-gathered and only rank 0, which saves, keeps
        the unsharded state (AdamW's for ViT-H/14: 5 GB) until its save() writes it."""
        if shard_dir is not None:
            self.write_shard(shard_dir)
            self.gathered = {IN_SHARD_FILES: self.size}
            return
        gathered = self._gather(keep=self.rank == 0)
        self.gathered = gathered if self.rank == 0 else None

    def write_shard(self, directory: Path) -> None:
        write_shard(directory, {"numels": [b.numel for b in self.buckets], "optimizer": self.local.state_dict()})

    def load_checkpoint(self, state: dict, directory: Path) -> None:
        """Rank 0: what a checkpoint's torch.pt holds for the optimizer (follow with broadcast_state())."""
        if IN_SHARD_FILES in state:
            self.loaded = {IN_SHARD_FILES: str(directory)}
        else:
            self.load_state_dict(state)

    def read_shards(self, directory: Path, buckets: list[Bucket], rank: int) -> dict:
        """The local optimizer's state_dict for `rank`'s slices of `buckets` (read_shards)."""
        return read_shards(directory, buckets, rank)["optimizer"]

    def _gather(self, keep: bool = True) -> dict:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.local.param_groups]
        groups[0]["params"] = list(range(len(self.params)))
        state: dict = {}
        for b, bucket in enumerate(self.buckets):
            own = self.local.state.get(self.shards[b], {})
            keys = sorted(own)  # the same on every rank: every rank stepped every slice
            sliced = [k for k in keys if torch.is_tensor(own[k]) and own[k].ndim == 1]
            full = hvd.grouped_allgather([own[k] for k in sliced], name=f"zero.state.{b}",
                                         process_set=self.set) if sliced else []
            if not keep:
                continue  # this rank took its part in the collective; it saves nothing
            for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes):
                entry = {k: own[k].clone() if torch.is_tensor(own[k]) else own[k] for k in keys if k not in sliced}
                entry.update({k: f[offset:offset + size].view_as(self.params[i]).clone()
                              for k, f in zip(sliced, full)})
                if entry:
                    state[i] = entry
        return {"state": state, "param_groups": groups}

    def _cut(self, full: dict) -> dict:
        """This rank's slices of an unsharded state_dict (any world size wrote it)."""
        groups = [{**full["param_groups"][0], "params": list(range(len(self.shards)))}]
        state: dict = {}
        stored = {int(k): v for k, v in full["state"].items()}
        for b, bucket in enumerate(self.buckets):
            present = [stored[i] for i in bucket.params if i in stored]
            if not present:
                continue
            entry = {}
            for key, value in present[0].items():
                if torch.is_tensor(value) and value.ndim > 0:
                    entry[key] = self._slice_of(bucket, b, key, stored)
                else:
                    entry[key] = value.clone() if torch.is_tensor(value) else value
            state[b] = entry
        return {"state": state, "param_groups": groups}

    def _slice_of(self, bucket: Bucket, b: int, key: str, stored: dict) -> torch.Tensor:
        out = torch.zeros_like(self.shards[b])
        for piece in bucket.pieces(self.rank):
            entry = stored.get(piece.param, {})
            if key in entry:
                values = entry[key].reshape(-1).to(out)
                out[piece.offset:piece.offset + piece.end - piece.start].copy_(values[piece.start:piece.end])
        return out


@torch.no_grad()
def clip_slices_(shards: Sequence[torch.Tensor], max_norm: float,
                 squares: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the whole model, given every rank's slices of it:
    the slices' squared norms summed over all ranks (every element counted once; padding is 0;
    `squares`: this rank's sum, when its elements do not each count once)."""
    if squares is None:
        squares = torch.zeros((), dtype=torch.float32, device=shards[0].device)
        for s in shards:  # one after another, as ever: the same sum to the last bit
            if s.grad is not None:
                squares = squares + torch.sum(s.grad.float() ** 2)
    total = hvd.allreduce(torch.as_tensor(squares, dtype=torch.float32).reshape(1), op=hvd.Sum,
                          name="zero.grad_norm").sqrt()[0]
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for s in shards:
        if s.grad is not None:
            s.grad.mul_(coefficient)
    return total


def write_shard(directory: Path, content: dict) -> None:
    """This rank's shard file (its slices: "numels" per bucket, "optimizer", zero=3's "params")."""
    final = directory / shard_file_name(hvd.rank(), hvd.size(), SHARD_SUFFIX)
    tmp = final.with_name(f".{final.name}.tmp")
    with fileio.large_output(tmp) as handle:
        torch.save(content, handle)
    os.replace(tmp, final)


def load_mapped_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer` takes a state_dict read_shards() read, copied off the shard file's mapping into
    the memory the build's first step gave the state and the load just freed. Left on the mapping,
    each update turns its pages into new private memory while the freed heap is never reused:
    ViT-g/14's zero=3 resume held 4 GB a rank more and ran its 22 GB cap out in the first step.
    Every tensor, Adam's step counts too: any one keeps the whole file mapped."""
    optimizer.load_state_dict(state)
    for entry in optimizer.state.values():
        for key, value in entry.items():
            if torch.is_tensor(value):
                entry[key] = value.clone()


def read_shards(directory: Path, buckets: list[Bucket], rank: int) -> dict:
    """`rank`'s slices of `buckets` (at their world size) from the shard files every rank of the
    saving run wrote: "optimizer", the local optimizer's state_dict, and "params" where zero=3
    wrote them. Its own file at the same world size (bit-identical), else the overlapping parts
    of each old slice, one file at a time."""
    own = own_shard(directory, SHARD_SUFFIX, rank, buckets[0].world)
    if own is not None:
        return _read_shard(own, buckets)
    files = find_shards(directory, SHARD_SUFFIX)
    if files is None:
        raise UserError(f"checkpoint {directory}: training.zero shard files expected, none found")
    state: dict = {}
    groups = None
    params: Optional[list[torch.Tensor]] = None
    for source, path in enumerate(files):
        old = _read_shard(path, buckets)
        groups = groups or old["optimizer"]["param_groups"]
        for b, bucket in enumerate(buckets):
            _recut_state(state.setdefault(b, {}), old["optimizer"]["state"].get(b, {}), bucket, len(files), rank,
                         source)
        if "params" in old:
            params = params or [torch.zeros(b.shard, dtype=old["params"][0].dtype) for b in buckets]
            for b, bucket in enumerate(buckets):
                fill_from(params[b], old["params"][b], bucket, len(files), rank, source)
    out = {"optimizer": {"state": {b: entry for b, entry in state.items() if entry}, "param_groups": groups}}
    return {**out, "params": params} if params is not None else out


def _recut_state(new: dict, entry: dict, bucket: Bucket, old_world: int, rank: int, source: int) -> None:
    for key, value in entry.items():
        if not (torch.is_tensor(value) and value.ndim == 1):
            new.setdefault(key, value)  # Adam's step count: the same on every rank
            continue
        if key not in new:  # made once, not per old file: it is a whole slice
            new[key] = torch.zeros(bucket.shard, dtype=value.dtype)
        fill_from(new[key], value, bucket, old_world, rank, source)


def _read_shard(path: Path, buckets: list[Bucket]) -> dict:
    try:
        # mmap: the file's pages back the tensors (page cache the kernel can drop), so a resume
        # holds no second copy of the slices and state it is replacing (ViT-g/14: 6 GB a rank)
        stored = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (OSError, RuntimeError, EOFError, ValueError) as err:
        raise UserError(f"cannot load {path}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") \
            from None
    if stored.get("numels") != [b.numel for b in buckets]:
        raise UserError(f"cannot load {path}: its training.zero buckets are not this model's")
    return stored
