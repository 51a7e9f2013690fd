"""parallel.tensor for the PyTorch backend: torchvision's ViT with each encoder block split
Megatron-LM's way over a tensor group of T ranks (hvdcls.maths.tensor_parallel: the layout and
which weight is cut how), the collectives over Horovod process sets.

Megatron's two operators bracket each sub-layer (attention, MLP): `f` before the column-split
layer is the identity forward and sums the input's gradient over the group backward (each rank
saw only its heads' or units' share of it; here fused with that layer, so that the sum runs
while the layer's weight gradients are computed); `g` after the row-split layer sums the ranks'
partial outputs forward and passes the gradient through backward. One all-reduce of the
activations forward and one backward per sub-layer. Everything else (the patch embedding, the
class token, the positions, the LayerNorms, the head) is whole on every rank of a group and
gets the same gradient on each, since its inputs and the gradient coming back are the group's
sum; so the data-parallel strategy needs only average each parameter over the ranks holding the
same slice (`data_set`), one per replica.

Horovod's process sets are made at run time (hvd.init(process_sets="dynamic"), HorovodBackend),
every rank making every set in one order, once per process (hvdcls.horovod_backend.process_set).

Mirror: tf_backend/tensor_parallel.py.
"""
from __future__ import annotations

import time
from typing import Any, Optional

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn

from hvdcls.config import Config
from hvdcls.horovod_backend import TensorPlace, sleep_until_done
from hvdcls.maths import tensor_parallel as plan

# The nap between two polls of a tensor group's all-reduce while a rank sleeps through it: the
# activations' sums are small and many (four a block and step), so shorter than the gradients'
# (0.1 and 1 ms measured alike: benchmarks/results/2026-12-07-tensor-wait).
TENSOR_NAP_SECONDS = 1e-4


def torch_cat(pieces: list, axis: int) -> torch.Tensor:
    return torch.cat(pieces, dim=axis)


class Channel:
    """The tensor group's sums of activations and of their gradients, with the bytes they sent
    and the seconds spent waiting for them (the strategy reports both per step beside the
    gradients'): from finish() until the sum is done, which includes waiting for the slowest
    rank of the group; a sum started earlier (start()) counts only what was not hidden.
    `asleep` (horovod.wait: auto and sleep; spin does not): poll and nap while it runs instead of
    Horovod's synchronize(), whose loop on `yield` takes the core from the threads that do the
    sum (Horovod's and Gloo's) when ranks outnumber cores."""

    def __init__(self, process_set: Any, asleep: bool = False):
        self.process_set, self.asleep, self.sent, self.seconds = process_set, asleep, 0, 0.0

    def allreduce(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.finish(self.start(x, name))

    def start(self, x: torch.Tensor, name: str) -> Any:
        """The sum of `x` over the group, started; finish() waits for it."""
        self.sent += x.numel() * x.element_size()
        return hvd.allreduce_async(x.contiguous(), op=hvd.Sum, name=name, process_set=self.process_set)  # Horovod

    def finish(self, handle: Any) -> torch.Tensor:
        """The sum start() began; only the time spent waiting for it counts as the sums'."""
        started = time.perf_counter()
        if self.asleep:
            sleep_until_done([handle], hvd.poll, TENSOR_NAP_SECONDS)
        summed = hvd.synchronize(handle)
        self.seconds += time.perf_counter() - started
        return summed

    def take(self) -> tuple[int, float]:
        """(bytes sent, seconds spent) since the last take."""
        taken = (self.sent, self.seconds)
        self.sent, self.seconds = 0, 0.0
        return taken


class _ColumnLinear(torch.autograd.Function):
    """Megatron's f and the column-split Linear after it, in one: forward `x W^T + b` (f is the
    identity); backward the input's gradient is summed over the tensor group while this rank
    computes the weight's and bias's gradients, which do not need the sum, so that the sum's
    wait hides behind them (autograd's Linear computes all three before f could start it)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, name):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.name = group, name
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        # under autocast the forward's product ran in grad's dtype: the gradients do too
        grad_x = grad.matmul(weight.to(grad.dtype)).to(x.dtype)
        pending = ctx.group.start(grad_x, ctx.name)
        rows = grad.reshape(-1, grad.shape[-1])
        grad_w = rows.t().mm(x.reshape(-1, x.shape[-1]).to(grad.dtype)) if ctx.needs_input_grad[1] else None
        grad_b = rows.sum(0) if ctx.needs_input_grad[2] else None
        return ctx.group.finish(pending), grad_w, grad_b, None, None


class ColumnParallelLinear(nn.Linear):
    """This rank's output rows of a Linear (its heads' or units' share), its input's gradient
    summed over the group (_ColumnLinear)."""

    def __init__(self, inputs: int, local_out: int, group: Channel, name: str):
        super().__init__(inputs, local_out)
        self.group, self.name = group, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ColumnLinear.apply(x, self.weight, self.bias, self.group, self.name)


class _SumOverGroup(torch.autograd.Function):
    """Megatron's g: the ranks' partial outputs summed forward, the gradient passed through."""

    @staticmethod
    def forward(ctx, x, group, name):
        return group.allreduce(x, name)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class RowParallelLinear(nn.Linear):
    """This rank's input columns of a Linear: its partial product, summed over the group, then
    the bias, whole on every rank, added once."""

    def __init__(self, local_in: int, out: int, group: Channel, name: str):
        super().__init__(local_in, out)
        self.group, self.name = group, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SumOverGroup.apply(F.linear(x, self.weight), self.group, self.name) + self.bias


class ParallelAttention(nn.Module):
    """nn.MultiheadAttention's self-attention (batch first, no mask, no dropout) on this rank's
    heads; the same parameter names, cut (in_proj_weight: its heads' rows of Q, K and V)."""

    def __init__(self, full: Any, tensor: int, group: Channel, name: str):
        super().__init__()
        hidden = full.embed_dim
        self.heads, self.head_dim = full.num_heads // tensor, full.head_dim
        local = self.heads * self.head_dim
        self.in_proj_weight = nn.Parameter(torch.empty(3 * local, hidden))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * local))
        self.out_proj = RowParallelLinear(local, hidden, group, f"{name}.attention")
        self.group, self.name = group, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        qkv = _ColumnLinear.apply(x, self.in_proj_weight, self.in_proj_bias, self.group, f"{self.name}.attention.grad")
        q, k, v = (t.reshape(batch, tokens, self.heads, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, -1))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(batch, tokens, self.heads * self.head_dim))


class ParallelEncoderBlock(nn.Module):
    """torchvision's EncoderBlock with its heads and MLP units split over the tensor group:
    the same keys (ln_1, self_attention, ln_2, mlp.0, mlp.3), this rank's slices."""

    def __init__(self, block: Any, tensor: int, group: Channel, name: str):
        super().__init__()
        # registered in torchvision's order, so that the state dict's keys come in its order
        self.ln_1 = block.ln_1
        self.self_attention = ParallelAttention(block.self_attention, tensor, group, name)
        self.dropout, self.ln_2 = block.dropout, block.ln_2
        first, last = block.mlp[0], block.mlp[3]
        local = first.out_features // tensor
        self.mlp = nn.Sequential(ColumnParallelLinear(first.in_features, local, group, f"{name}.mlp.grad"), nn.GELU(),
                                 block.mlp[2], RowParallelLinear(local, last.out_features, group, f"{name}.mlp"),
                                 block.mlp[4])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.self_attention(self.ln_1(inputs))) + inputs
        return x + self.mlp(self.ln_2(x))


class TensorParallel(TensorPlace):
    """One rank's place in parallel.tensor's layout, and what the backend asks of it."""

    def __init__(self, layout: plan.Layout, rank: int, asleep: bool = False):
        super().__init__(hvd, layout, rank)  # Horovod: its sets
        self.channel = Channel(self.group, asleep)  # the blocks' activations' sums

    def shard(self, model: nn.Module) -> nn.Module:
        """`model` (whole, the same on every rank) with its encoder blocks replaced by this
        rank's slices of them."""
        whole = model.state_dict()
        layers = model.get_submodule("encoder.layers")
        for name, block in list(layers.named_children()):
            setattr(layers, name, ParallelEncoderBlock(block, self.layout.tensor, self.channel, f"tp.{name}"))
        model.load_state_dict(plan.split_state(whole, self.layout.tensor, self.t, torch_cat))
        return model

    def broadcast(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Replica 0's tensors to the other replicas, each rank from the one holding its slice."""
        if self.layout.replicas == 1:
            return
        handles = [hvd.broadcast_async_(t, self.data_root, name=f"tp.broadcast.{n}", process_set=self.data_set)
                   for n, t in named]  # Horovod
        for handle in handles:
            hvd.synchronize(handle)

    def gather(self, state: dict) -> dict:
        """The whole state dict (torchvision's layout) from the tensor group's slices (a
        collective of the group: every rank of it calls, each gets the whole)."""
        tensor = self.layout.tensor
        gathered = {}
        for key, value in state.items():
            if plan.rule_of(key) is None:
                gathered[key] = value
                continue
            flat = hvd.allgather(value.detach().reshape(1, -1).contiguous(), name=f"tp.gather.{key}",
                                 process_set=self.group)  # Horovod: (T, n), in tensor-rank order
            slices = [row.reshape(value.shape) for row in flat]
            gathered[key] = plan.join_entry(key, slices, torch_cat)
        assert len(gathered) == len(state) and tensor > 1
        return gathered

    def norm_shares(self, names: list[str]) -> list[float]:
        """Per parameter (by its model name), its squares' share of the global gradient norm
        when the group sums every rank's (plan.norm_share)."""
        return [plan.norm_share(name, self.layout.tensor) for name in names]

    @torch.no_grad()
    def clip_grad_norm_(self, named: list[tuple[str, nn.Parameter]], max_norm: float) -> torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ over the whole model, given this rank's slices: the
        norm one process would compute (the slices' squares summed over the group, the whole
        parameters' counted once), so every rank of the group scales by the same coefficient
        and the parameters it holds whole stay equal across it."""
        shares = self.norm_shares([name for name, _ in named])
        squares = sum(share * torch.sum(p.grad.float() ** 2) for share, (_, p) in zip(shares, named)
                      if p.grad is not None)
        total = hvd.allreduce(torch.as_tensor(squares, dtype=torch.float32).reshape(1), op=hvd.Sum,
                              name="tp.grad_norm", process_set=self.group).sqrt()[0]  # Horovod
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for _, p in named:
            if p.grad is not None:
                p.grad.mul_(coefficient)
        return total

    # -- checkpoints: whole on disk (torchvision's layout), cut on load --

    def gather_optimizer(self, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict:
        """The optimizer's state_dict() with every per-parameter tensor whole (a collective of
        the group). `names`: id(parameter) -> its name in the model, whose rule cuts it."""
        return self.gather_optimizer_state(optimizer.state_dict(), param_keys(optimizer, names))

    def gather_optimizer_state(self, state: dict, keys: list[str]) -> dict:
        """An optimizer state_dict (its parameters numbered as `keys` names them) with every
        per-parameter tensor whole (a collective of the group)."""
        for kind, entries in by_kind(state, keys).items():
            whole = self.gather(entries)
            for index, key in enumerate(keys):
                if key in whole:
                    state["state"][index][kind] = whole[key]
        return state

    def split_optimizer(self, state: dict, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict:
        """A whole optimizer state_dict() (a checkpoint's) cut to this rank's slices."""
        return self.split_optimizer_state(state, param_keys(optimizer, names))

    def split_optimizer_state(self, state: dict, keys: list[str]) -> dict:
        """A whole optimizer state_dict (its parameters numbered as `keys` names them) cut to
        this rank's slices."""
        tensor = self.layout.tensor
        cut = {**state, "state": {i: dict(entry) for i, entry in state["state"].items()}}
        for kind, entries in by_kind(state, keys).items():
            for index, key in enumerate(keys):
                if key in entries:
                    cut["state"][index][kind] = plan.split_entry(key, entries[key], tensor, self.t, torch_cat)
        return cut

    def cut(self, state: dict) -> dict:
        """This rank's slices of a whole state dict (torchvision's layout)."""
        return plan.split_state(state, self.layout.tensor, self.t, torch_cat)

    def spread(self, named: list[tuple[str, torch.Tensor]], whole: Optional[dict]) -> None:
        """Every rank's slices of rank 0's whole tensors where rank 0 read them (`whole`, by the
        same keys; None elsewhere), else replica 0's to the other replicas (a collective)."""
        if hvd.broadcast_object(whole is not None, root_rank=0, name="tp.spread"):  # Horovod
            self.deal(named, whole)
        else:
            self.broadcast(named)

    def take_whole(self, state: dict) -> dict:
        """Rank 0, reading a checkpoint: keep the whole state for `deal`, hand back the model
        cut to this rank's slices (the optimizer's is the strategy's to cut)."""
        self.whole = state
        return {**state, "model": self.cut(state["model"])}

    def deal(self, named: list[tuple[str, torch.Tensor]], whole: Optional[dict]) -> None:
        """Every rank's slices of rank 0's whole tensors (`whole`, by the same keys; None on the
        other ranks), broadcast whole over the world and cut by each rank (a collective)."""
        for key, local in named:
            rule = plan.rule_of(key)
            if rule is None or local.ndim == 0:
                buffer = whole[key].to(local.device, local.dtype) if whole is not None else local
            elif whole is not None:
                buffer = whole[key].to(local.device, local.dtype).contiguous()
            else:
                shape = list(local.shape)
                shape[rule.axis] *= self.layout.tensor
                buffer = local.new_empty(shape)
            hvd.broadcast_(buffer, 0, name=f"tp.deal.{key}")  # Horovod
            with torch.no_grad():
                local.copy_(buffer if rule is None or local.ndim == 0
                            else plan.split_entry(key, buffer, self.layout.tensor, self.t, torch_cat))

    def deal_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> None:
        """After rank 0 read a checkpoint (`take_whole`): every rank's slices of the model and of
        the optimizer's state (its live tensors, step counts included), from rank 0's whole ones."""
        whole = self.whole
        self.deal(list(model.state_dict().items()), whole["model"] if whole else None)
        keys = param_keys(optimizer, names)
        stored = by_kind(whole["optimizer"], keys, counts=True) if whole else {}
        for kind, live in sorted(by_kind(optimizer.state_dict(), keys, counts=True).items()):
            self.deal(list(live.items()), stored.get(kind) if whole else None)
        self.whole = None

    def dealing(self) -> bool:
        """Whether rank 0 read a checkpoint to deal (a collective)."""
        return bool(hvd.broadcast_object(self.whole is not None, root_rank=0, name="tp.dealing"))  # Horovod


def param_keys(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> list[str]:
    """Each parameter's model name, in the order its optimizer's state_dict() numbers them."""
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def by_kind(state: dict, keys: list[str], counts: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """An optimizer state_dict()'s per-parameter tensors ({kind: {parameter name: tensor}}; the
    0-d step counts, whole everywhere, only with `counts`)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for index, entry in state["state"].items():
        for kind, value in entry.items():
            if torch.is_tensor(value) and (counts or value.ndim > 0):
                out.setdefault(kind, {})[keys[index]] = value
    return out


def build(model: nn.Module, config: Config) -> tuple[nn.Module, Optional[TensorParallel]]:
    """parallel.tensor > 1: every rank takes rank 0's whole model (the ranks must split the same
    one), then keeps its slices of the blocks. Else the model as it is, and None."""
    if config.parallel.tensor == 1:
        return model, None
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # Horovod
    parallel = TensorParallel(plan.Layout(hvd.size(), config.parallel.tensor), hvd.rank(),
                              config.horovod.wait != "spin")
    return parallel.shard(model), parallel
