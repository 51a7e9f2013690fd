"""training.zero=3 for the PyTorch backend: the parameters sharded, block by block.

Mirror: tf_backend/zero3.py. The model's parameters are cut into blocks
(hvdcls.maths.zero.blocks: a ViT encoder block, a ResNet stage, else each top-level child; a
parameter none of them holds, its module's own small block), and each rank keeps, per block,
ONE float32 nn.Parameter: its 1/N slice of the block's flat, padded parameters, the only
persistent copy. The original parameters are taken off their modules. Just before a block's
forward a hook all-gathers the block (Gathered: an autograd Function whose backward starts
the reduce-scatter of the flat gradient, averaged, onto the slice) and sets each parameter's name
on its module as a view of the gathered flat; just after it, the names are dropped again, so
the gathered block lives only as long as autograd needs it. With activation checkpointing
(torch_backend/recompute.py) the hooks fire inside the checkpointed segment: the block is
gathered again for its recomputation in backward, and one block at a time is held. Without
it the gathered blocks autograd saved live until backward (exact, but no saving of memory
during the step). Every rank runs the same forwards in the same order, so the collectives
match; evaluation (no gradients) gathers the same way.
"""
from __future__ import annotations

from collections import deque
from functools import partial
from typing import Callable, Optional

import horovod.torch as hvd
import torch
from torch import nn

from hvdcls.backend import LazyArrays
from hvdcls.errors import UserError
from hvdcls.maths.zero import Block, blocks
from torch_backend import recompute

FLOAT32_BYTES = 4
INDEX = "zero3"  # rank 0's checkpoint: the blocks' index (its parameters are in the shard files)
IN_FLIGHT = 2  # gradient reduce-scatters started before the oldest is waited for (zero 1/2's too)


class Gathered(torch.autograd.Function):
    """forward: a block's full padded flat from every rank's slice (Horovod's allgather, in rank
    order); backward: the reduce-scatter of the flat gradient started, whose result, this rank's
    slice of the ranks' average, ShardedParameters adds to the slice's .grad once it is done."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, owner: ShardedParameters, b: int) -> torch.Tensor:
        ctx.owner, ctx.b = owner, b
        # evaluation runs under inference_mode, whose tensors Horovod's thread may not fill
        with torch.inference_mode(False):
            return owner.fetch(b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        owner, b = ctx.owner, ctx.b
        owner.backward = True  # the gathers from here to the next forward are recomputations
        owner.release(b)  # a recomputation that stopped early (torch's checkpoint) left it set
        owner.scatter(b, grad)
        return None, None, None  # the slice's gradient is added when its reduce-scatter is done


def segments(model: nn.Module) -> list[str]:
    """The modules that gather a block each: the activation checkpointing's segments (a ViT's
    encoder blocks, a ResNet's stages) and the top-level children that hold none of them."""
    inner = recompute.segment_names(model)
    tops = [name for name, _ in model.named_children()
            if not any(s == name or s.startswith(name + ".") for s in inner)]
    return inner + tops


class ShardedParameters:
    """The model's parameters as every rank's slices (`shards`, one per block), gathered for
    each block's forward by hooks on its module."""

    def __init__(self, model: nn.Module):
        named = list(model.named_parameters())
        self.rank = hvd.rank()
        self.blocks: list[Block] = blocks([n for n, _ in named], [tuple(p.shape) for _, p in named], hvd.size(),
                                          segments(model))
        self.places = {name: _place(model, name) for name, _ in named}
        self.order = list(model.state_dict())  # the unsharded state's names, in order
        self.shards = [self._cut(block, [p for _, p in named]) for block in self.blocks]
        for name, _ in named:
            module, attr = self.places[name]
            del module._parameters[attr]  # the slice is the only copy now
        del named
        self.held: set[int] = set()  # blocks whose names are set now
        self.held_bytes = self.peak_bytes = 0
        self.sent = 0  # bytes handed to Horovod since the counter last took them
        # The gather of the block that comes next starts before this one's is waited for, so
        # that it crosses while this block computes: in forward the next block in order, in
        # backward the recomputed block before (the checkpointed segments, in reverse).
        self.pending: dict[int, int] = {}  # block -> the Horovod handle of its gather, started ahead
        # The gradients' reduce-scatters cross while backward goes on, IN_FLIGHT at most
        self.scattering: deque = deque()  # (block, handle, flat gradient), oldest first
        self.backward = False  # since the last forward began (Gathered's backward sets it)
        self.recomputed = [b for b, block in enumerate(self.blocks) if block.module in recompute.checkpointed(model)]
        model.register_forward_pre_hook(lambda _m, _args: self._forward_begins())  # before any block's hook
        for b, block in enumerate(self.blocks):
            self._hook(model.get_submodule(block.module), b)

    def _cut(self, block: Block, params: list[torch.Tensor]) -> nn.Parameter:
        """This rank's slice of the block's flat parameters (float32; padding 0)."""
        bucket = block.bucket
        flat = torch.zeros(bucket.padded, dtype=torch.float32, device=params[bucket.params[0]].device)
        with torch.no_grad():
            for i, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes):
                flat[offset:offset + size].copy_(params[i].reshape(-1))
        lo, hi = bucket.slice(self.rank)
        return nn.Parameter(flat[lo:hi].clone())

    def _hook(self, module: nn.Module, b: int) -> None:
        """A ResNet stage is checkpointed as a whole inside its own forward: its first child's
        call is the first thing inside the segment, so the recomputation gathers again."""
        first, last = (module[0], module[-1]) if isinstance(module, recompute.CheckpointedStage) else (module, module)
        first.register_forward_pre_hook(lambda _m, _args: self.gather(b))
        last.register_forward_hook(lambda _m, _args, _out: self.release(b))

    def scatter(self, b: int, grad: torch.Tensor) -> None:
        """Start block b's gradient reduce-scatter (Horovod: averaged; rank r gets its slice)."""
        self.sent += grad.numel() * FLOAT32_BYTES
        handle = hvd.reducescatter_async(grad.contiguous(), op=hvd.Average, name=f"zero3.grads.{b}")  # Horovod
        self.scattering.append((b, handle, grad))
        while len(self.scattering) > IN_FLIGHT:
            self._scattered()

    def _scattered(self) -> None:
        b, handle, _ = self.scattering.popleft()
        part = hvd.synchronize(handle)
        shard = self.shards[b]
        if shard.grad is None:
            shard.grad = part
        else:  # another backward pass's, accumulated
            shard.grad.add_(part)

    def finish_scatters(self) -> None:
        """Every gradient reduce-scatter done and added to its slice's .grad (before a step, and
        before the next forward, whose backward starts them again under the same names)."""
        while self.scattering:
            self._scattered()

    def _forward_begins(self) -> None:
        self.finish_scatters()
        if self.backward:  # a gather started ahead in backward that nothing took
            self.drop_pending()
            self.backward = False

    def _start(self, b: int) -> int:
        self.sent += self.shards[b].numel() * FLOAT32_BYTES
        return hvd.allgather_async(self.shards[b].detach(), name=f"zero3.params.{b}")  # Horovod

    def _after(self, b: int) -> Optional[int]:
        """The block gathered next: in forward the next in order, in backward the recomputed
        segment before this one (None: none, or not known)."""
        if not self.backward:
            return b + 1 if b + 1 < len(self.blocks) else None
        at = self.recomputed.index(b) if b in self.recomputed else 0
        return self.recomputed[at - 1] if at > 0 else None

    def fetch(self, b: int) -> torch.Tensor:
        """Block b's gathered flat (started ahead, or now), the next block's gather started first.
        Every rank gathers in the same order, so the collectives match."""
        handle = self.pending.pop(b, None)
        if handle is None:
            handle = self._start(b)
        following = self._after(b)
        if following is not None and following not in self.pending:
            self.pending[following] = self._start(following)
        return hvd.synchronize(handle)

    def drop_pending(self) -> None:
        """Wait for and forget the gathers started ahead (before the slices change: a step, a
        restore, a resume)."""
        for handle in self.pending.values():
            hvd.synchronize(handle)
        self.pending.clear()

    def gather(self, b: int) -> None:
        block = self.blocks[b]
        full = Gathered.apply(self.shards[b], self, b)
        for name, offset, size, shape in zip(block.names, block.bucket.offsets, block.bucket.sizes, block.shapes):
            module, attr = self.places[name]
            setattr(module, attr, full[offset:offset + size].view(shape))  # a plain attribute, not a Parameter
        if b not in self.held:
            self.held.add(b)
            self.held_bytes += block.bucket.padded * FLOAT32_BYTES
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def release(self, b: int) -> None:
        """The block's names dropped: the gathered flat goes once autograd holds no view of it."""
        if b not in self.held:
            return
        for name in self.blocks[b].names:
            module, attr = self.places[name]
            delattr(module, attr)
        self.held.discard(b)
        self.held_bytes -= self.blocks[b].bucket.padded * FLOAT32_BYTES

    def full_state(self, model: nn.Module) -> LazyArrays:
        """The unsharded state (parameters and buffers, by name, in the model's order), each
        parameter gathered when it is read, its block all-gathered once and kept until another
        block is read (a collective: every rank must read the same names in the same order, as
        the digests do, sorted). So a walk over it holds one block, not the whole model (ViT-g/14's
        4 GB a rank, on top of the slices, gradients and AdamW state the step leaves)."""
        buffers = model.state_dict()  # what is not sharded (the parameters are off the model)
        where = {name: (b, offset, size, shape) for b, block in enumerate(self.blocks)
                 for name, offset, size, shape in zip(block.names, block.bucket.offsets, block.bucket.sizes,
                                                      block.shapes)}
        held: dict[int, torch.Tensor] = {}

        @torch.no_grad()
        def gathered(name: str) -> torch.Tensor:
            b, offset, size, shape = where[name]
            if b not in held:
                held.clear()  # the block read before goes first
                held[b] = hvd.allgather(self.shards[b].detach(), name=f"zero3.state.{b}")  # Horovod
            return held[b][offset:offset + size].view(shape)

        return LazyArrays({name: partial(gathered, name) if name in where else partial(buffers.__getitem__, name)
                           for name in self.order})

    def index(self) -> dict:
        """What rank 0's checkpoint says of the shards: enough to find a parameter in them."""
        return {"world": hvd.size(), "blocks": [block.index() for block in self.blocks]}

    def check_index(self, index: dict, describe: Callable[[], str]) -> None:
        """A checkpoint's index must list this model's blocks (the world size may differ)."""
        if index.get("blocks") != [block.index() for block in self.blocks]:
            raise UserError(f"cannot load {describe()}: its training.zero=3 blocks are not this model's")


def _place(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return model.get_submodule(path), attr
