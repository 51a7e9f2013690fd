"""horovod.compression=powersgd: our PowerSGDReducer averages the gradient list inside the
compiled step (its warm-up steps a trace of their own), then the backend's update. Its Q, error
feedback and step count travel with the optimizer's state in checkpoints, snapshots and
broadcasts.

Mirror: torch_backend/strategies/powersgd.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import horovod.tensorflow as hvd

from hvdcls.config import Config
from hvdcls.errors import UserError
from tf_backend.compression import PowerSGDReducer
from tf_backend.strategies.plain import MakeOptimizer, Plain
from tf_backend.weights import CHECKPOINT_FILE


class Powersgd(Plain):
    name = "powersgd"
    reduces_in_tape = False  # our reduction of the whole gradient list

    def __init__(self, host: Any, config: Config, variables: list, make_optimizer: MakeOptimizer):
        super().__init__(host, config, variables, make_optimizer)
        self.reducer = PowerSGDReducer([tuple(v.shape) for v in variables], config.horovod.powersgd)
        self.counter = self.reducer.counter  # what the reducer sent, warm-up and compressed

    def warmup(self) -> bool:
        return self.reducer.warmup

    def step(self, grads: Optional[list] = None, warmup: bool = False, overlapped: bool = False) -> None:
        """Horovod: PowerSGD averages the gradients; the error feedback is kept unscaled. Its
        plans are the reduced variables'; a frozen one's gradient is None, and no part of it."""
        host = self.host
        scale = host.optimizer.dynamic_scale.value if host.loss_scaled else 1.0
        trained = {v.path: g for v, g in zip(host.trained, grads or [])}
        every = [trained.get(v.path) for v in self.variables]
        host.apply_update([g for g in self.reducer.reduce(every, scale, warmup) if g is not None])

    def count(self, warmup: bool) -> None:
        self.reducer.count(warmup)

    def save_state(self, state: dict) -> None:
        super().save_state(state)
        state.update(self.reducer.state_arrays())

    def load_state(self, state: dict, directory: Path) -> None:
        super().load_state(state, directory)
        try:
            self.reducer.load_arrays(state)
        except (KeyError, ValueError) as err:
            raise UserError(f"cannot load {directory / CHECKPOINT_FILE}: no PowerSGD state that fits "
                            f"({err})") from None

    def snapshot(self) -> dict:
        return {**super().snapshot(), "powersgd": self.reducer.state_arrays()}

    def restore(self, snapshot: dict) -> None:
        super().restore(snapshot)
        self.reducer.load_arrays(snapshot["powersgd"])

    def broadcast_state(self) -> None:
        super().broadcast_state()
        hvd.broadcast_variables(self.reducer.state_variables(), root_rank=0)  # Horovod: rank 0's Q, error
        self.reducer.step = hvd.broadcast_object(self.reducer.step, root_rank=0, name="powersgd.step")

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        self.reducer.average_errors()  # Horovod: one error for all ranks, training unchanged
