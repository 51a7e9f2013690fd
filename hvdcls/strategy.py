"""Reduction strategies: how the ranks' gradients become one step, one small object per mode.

Each reduction mode (how the gradients are exchanged, what the optimizer holds, what a
checkpoint and an elastic snapshot carry) is one class per backend behind one interface,
`Strategy`; a backend's build() picks it ONCE, from the config, through this registry, and then
only delegates to it (no `if zero`, `if powersgd` or `if adasum` left in a backend's file:
tests/unit/test_strategy.py looks). The modes:

  plain     Horovod's averaged all-reduce of every gradient (horovod.compression=fp16 is an
            option of it: the same exchange and step with float16 on the wire, so not a mode;
            ZeRO takes the same option)
  adasum    horovod.op=adasum: Horovod combines the weight updates inside the step
  powersgd  horovod.compression=powersgd: our low-rank reduction after backward, a plain step
  zero      training.zero=1 or 2: the optimizer state (and at 2 the gradients) sharded by rank
  zero3     training.zero=3: the parameters too, each block all-gathered for its forward (and
            its recomputation) and its gradients reduce-scattered in backward (both backends)

What both backends share lives here once: the choice (`strategy_name`), the refusals that need
the device (`refuse`: float16 loss scaling under ZeRO), and the interface. The config's own
checks (hvdcls.config.checks) refuse the combinations a config alone rules out.

Composition with parallel.tensor: a strategy reduces over the parameters and the Horovod process
set it is given, not over "the model on every rank". The tensor split (torch_backend/ and
tf_backend/tensor_parallel.py) cuts the encoder blocks' parameters over the tensor group and hands
this rank's slices to the data-parallel strategy (plain, fp16, zero 1 and 2), built with the
ranks holding the same slices (`replicas.data_set`) to average over, rather than being one more
exclusive mode; checkpoints stay whole (replica 0's group gathers them).

The backends' strategies are imported lazily, by module path (the core never imports a
framework): torch_backend/strategies/ and tf_backend/strategies/, the same file names.
"""
from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from hvdcls.errors import UserError

if TYPE_CHECKING:
    from hvdcls.config import Config

Refusal = Callable[["Config", bool], None]


def refuse_nothing(config: Config, loss_scaled: bool) -> None:
    """A mode that serves every config its checks let through."""


def refuse_loss_scaled_shards(config: Config, loss_scaled: bool) -> None:
    """ZeRO: float16 mixed precision's loss scaling (known once the device is: amp_dtype=auto is
    float16 on a GPU) would unscale and check for infs the local slices only."""
    if loss_scaled:
        raise UserError(f"config training.zero={config.training.zero} with float16 mixed precision "
                        "(training.amp on a GPU): the loss scaler does not see the sharded gradients; "
                        "use training.amp_dtype=bfloat16")


@dataclass(frozen=True)
class StrategySpec:
    name: str
    torch: str  # "module:Class", imported when chosen
    tensorflow: str
    refuse: Refusal  # what it cannot serve once the device is known: one-line UserErrors
    summary: str

    def factory(self, backend: str) -> Callable[..., Strategy]:
        path = self.torch if backend == "torch" else self.tensorflow
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)


def _spec(name: str, refuse: Refusal, summary: str) -> StrategySpec:
    return StrategySpec(name, f"torch_backend.strategies.{name}:{name.capitalize()}",
                        f"tf_backend.strategies.{name}:{name.capitalize()}", refuse, summary)


STRATEGIES: dict[str, StrategySpec] = {spec.name: spec for spec in (
    _spec("plain", refuse_nothing, "Horovod's averaged all-reduce (horovod.compression=none or fp16)"),
    _spec("adasum", refuse_nothing, "horovod.op=adasum: Horovod combines the updates in the step"),
    _spec("powersgd", refuse_nothing, "horovod.compression=powersgd: low-rank factors all-reduced"),
    _spec("zero", refuse_loss_scaled_shards, "training.zero=1 or 2: optimizer state sharded by rank"),
    _spec("zero3", refuse_loss_scaled_shards, "training.zero=3: parameters sharded too, gathered per block"),
)}


def strategy_name(config: Config) -> str:
    """The one place the config's reduction keys are read for a mode (the config's checks have
    refused the combinations no mode serves: zero with powersgd or adasum, powersgd with adasum)."""
    if config.training.zero == 3:
        return "zero3"
    if config.training.zero:
        return "zero"
    if config.horovod.compression == "powersgd":
        return "powersgd"
    if config.horovod.op == "adasum":
        return "adasum"
    return "plain"


def writes_shard_files(config: Config) -> bool:
    """Whether a checkpoint has each rank write its own shard file (training.zero), rather than
    rank 0 one file: parallel.tensor's checkpoints are whole (its strategies gather them)."""
    return bool(config.training.zero) and config.parallel.tensor == 1


def choose(config: Config, backend: str, loss_scaled: bool) -> Callable[..., Strategy]:
    """The strategy class for this config on `backend` ("torch" or "tensorflow"), after its
    refusals (nothing is built when one refuses)."""
    spec = STRATEGIES[strategy_name(config)]
    spec.refuse(config, loss_scaled)
    return spec.factory(backend)


class Strategy(abc.ABC):
    """One reduction mode on one backend. The backend owns the model, the loss and the mixed
    precision; the strategy owns the optimizer (`optimizer`), the exchange of the gradients and
    the step, the optimizer's and its own state in checkpoints and snapshots, and the bytes it
    sends (`counter`, a hvdcls.maths.powersgd.ByteCounter)."""

    name: str
    optimizer: Any
    counter: Any

    def begin(self, passes: int) -> None:
        """Before a step's `passes` backward passes (torch: gradients cleared, hooks armed)."""
        return None  # nothing, by default

    @abc.abstractmethod
    def step(self, grads: Optional[list] = None) -> Optional[float]:
        """Exchange this rank's accumulated gradients (torch: held in .grad, `grads` None;
        TensorFlow: the list) and step; the seconds waited for the exchange, or None."""

    @abc.abstractmethod
    def save_state(self, state: dict) -> None:
        """Add the optimizer's and the strategy's own entries to the backend's checkpoint."""

    def saved(self) -> None:
        """After the backend wrote the checkpoint (what was kept only to be written goes)."""
        return None  # nothing, by default

    @abc.abstractmethod
    def load_state(self, state: dict, directory: Path) -> None:
        """Take them back from a checkpoint read from `directory` (rank 0; broadcast_state follows)."""

    @abc.abstractmethod
    def snapshot(self) -> dict:
        """Copies of the state, for elastic's in-memory commits."""

    @abc.abstractmethod
    def restore(self, snapshot: dict) -> None: ...

    @abc.abstractmethod
    def broadcast_state(self) -> None:
        """Horovod: every rank takes rank 0's state (a collective)."""

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        """Every rank, before rank 0 saves (a collective where the state is sharded or per rank)."""
        return None  # nothing, by default

    @abc.abstractmethod
    def held_grads(self) -> Any:
        """The gradients this rank holds now, for Backend.memory (tensors, or a byte count)."""

    def communication(self) -> Optional[dict]:
        return self.counter.summary()
