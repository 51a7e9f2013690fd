"""The plain strategy: Horovod averages every gradient (horovod.compression=fp16: in float16 on
the wire), through DistributedGradientTape as backward returns them, or one all-reduce per
gradient (timed apart: training.balance=dynamic) or grouped (accumulated passes); the backend's
update follows.

Mirror: torch_backend/strategies/plain.py. The variables it reduces are the ones it is given
(`variables`), over every rank, or under parallel.tensor over the ranks holding the same slices
(`replicas`; hvdcls.strategy: a data-parallel strategy composes).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import horovod.tensorflow as hvd
import keras
import numpy as np

from hvdcls.config import Config
from hvdcls.errors import UserError
from hvdcls.maths import powersgd
from hvdcls.strategy import Strategy
from tf_backend import finetune, tensor_parallel, zero
from tf_backend.strategies import check_count, refuse_sharded_parameters, tf_variables, variable_bytes
from tf_backend.weights import CHECKPOINT_FILE

MakeOptimizer = Callable[..., keras.optimizers.Optimizer]  # (scales=None) -> a Keras optimizer


class Plain(Strategy):
    name = "plain"
    op = hvd.Average
    reduces_in_tape = True  # Horovod's DistributedGradientTape may reduce as backward returns

    def __init__(self, host: Any, config: Config, variables: list, make_optimizer: MakeOptimizer,
                 replicas: Optional[tensor_parallel.TensorParallel] = None):
        """`host`: the backend (its model, update, loss scaling); `variables`: those reduced;
        `replicas`: parallel.tensor's TensorParallel, whose data-parallel set it averages over;
        None: every rank."""
        hv = config.horovod
        self.host, self.variables, self.replicas = host, variables, replicas
        # Horovod: the set the gradients are averaged over
        self.process_set = replicas.data_set if replicas else hvd.global_process_set
        self.whole: Optional[dict] = None  # parallel.tensor: what rank 0 saves, gathered
        shapes = [tuple(v.shape) for v in variables]
        self.compression = hvd.Compression.fp16 if hv.compression == "fp16" else hvd.Compression.none
        self.counter = powersgd.ByteCounter(powersgd.dense_bytes(shapes))
        self.step_bytes = powersgd.communication(shapes, hv.compression)["bytes_per_step"]
        # parallel.tensor with one replica: nobody to average with, so no collective at all.
        # Horovod 0.28.1's TF all-reduce on a process set of one rank failed now and then at
        # np=2 with the sets [0] and [1] ("Process set provided does not exist, or has not been
        # registered": traced and eager, single and grouped, not the same call each time).
        self.alone = bool(replicas and replicas.layout.replicas == 1)
        if self.alone:  # the step takes the tape's local gradients (a subclass's own value stands otherwise)
            self.reduces_in_tape = False
            self.step_bytes = 0
        self.activation_bytes = 0  # parallel.tensor: what the last step's blocks summed over the group
        self.optimizer = self.make(config, make_optimizer)

    def make(self, config: Config, make_optimizer: MakeOptimizer) -> Any:
        optimizer = make_optimizer(finetune.variable_scales(self.host.model, config.model.name,
                                                            config.optimizer.layer_decay))
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer) if self.host.loss_scaled else optimizer
        optimizer.build(self.variables)  # slots exist before any broadcast
        return optimizer

    def warmup(self) -> bool:
        """A Python bool the compiled step is traced for (PowerSGD's warm-up steps)."""
        return False

    def tape(self, tape):
        """Horovod: the tape all-reduces the gradients (fused, compressed) as it returns them."""
        return hvd.DistributedGradientTape(tape, compression=self.compression, op=self.op,
                                           process_set=self.process_set)

    def step(self, grads: Optional[list] = None, warmup: bool = False, overlapped: bool = False) -> None:
        """Inside the compiled step: `grads` averaged, then the backend's update. `overlapped`:
        one all-reduce per gradient, as DistributedGradientTape issues them (each starts once
        its gradient exists, overlapping the rest of backward); else one for the N accumulated
        passes, as DistributedOptimizer does."""
        assert grads is not None
        if self.alone:
            self.host.apply_update(grads)
        elif overlapped:
            self.host.apply_update([hvd.allreduce(g, op=self.op, compression=self.compression,
                                                  process_set=self.process_set) for g in grads])
        else:
            self.host.apply_update(hvd.grouped_allreduce(grads, op=self.op, compression=self.compression,
                                                         process_set=self.process_set))

    def count(self, warmup: bool) -> None:
        self.counter.add(self.step_bytes)  # Horovod sent every gradient, as configured
        if self.replicas:
            self.activation_bytes = self.replicas.channel.take()

    def communication(self) -> Optional[dict]:
        summary = self.counter.summary()
        if self.replicas:  # parallel.tensor: the activations' sums within the group, beside
            summary["tensor_parallel_bytes_per_step"] = self.activation_bytes
        return summary

    def entries(self) -> list:
        """parallel.tensor: the checkpoint's entries and the model paths that cut them."""
        return tensor_parallel.entries(self.host.model, self.optimizer)

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        """parallel.tensor: replica 0's tensor group gathers the model and the optimizer's state
        whole (the TF ViT's layout) for rank 0 to save; a collective of that group."""
        if self.replicas and self.replicas.layout.replica(hvd.rank()) == 0:
            whole = self.replicas.gather(self.entries())
            self.whole = whole if hvd.rank() == 0 else None  # the others only helped gather

    def save_state(self, state: dict) -> None:
        state.update({f"optimizer/{i}": v.numpy for i, v in enumerate(self.optimizer.variables)})
        if self.whole:  # parallel.tensor: the gathered, whole arrays in place of this rank's slices
            state.update(self.whole)
            self.whole = None

    def load_state(self, state: dict, directory: Path) -> None:
        path = directory / CHECKPOINT_FILE
        refuse_sharded_parameters(path, state)
        if zero.IN_SHARD_FILES in state:
            raise UserError(f"cannot load {path}: its optimizer state is in training.zero's per-rank shard "
                            "files; resume it with training.zero=1 or 2")
        check_count(path, state, "optimizer", len(self.optimizer.variables))
        if self.replicas:  # rank 0's slices now (the model's too); broadcast_state deals every rank its own
            self.replicas.take_whole(state, self.entries())
        for i, variable in enumerate(self.optimizer.variables):
            variable.assign(state[f"optimizer/{i}"])

    def snapshot(self) -> dict:
        # copies: a numpy view of a variable's buffer would follow the next steps' updates
        return {"optimizer": [np.array(v.numpy(), copy=True) for v in self.optimizer.variables],
                "counter": dataclasses.replace(self.counter)}

    def restore(self, snapshot: dict) -> None:
        for variable, value in zip(self.optimizer.variables, snapshot["optimizer"]):
            variable.assign(value)
        vars(self.counter).update(vars(snapshot["counter"]))  # the reducer's counter too: one object

    def broadcast_state(self) -> None:
        if not self.replicas:
            hvd.broadcast_variables(tf_variables(self.optimizer.variables), root_rank=0)  # Horovod
        elif self.replicas.dealing():  # rank 0 read a checkpoint: every rank takes its slices of it
            self.replicas.deal(self.entries())
        else:
            self.replicas.broadcast(self.optimizer.variables)

    def sources(self, trained: list) -> list:
        """What the compiled step differentiates, given the variables trained now."""
        return tf_variables(trained)

    def held_params(self) -> int:
        """The parameters' bytes this rank holds (Backend.memory): every one, unsharded."""
        return variable_bytes(self.variables)

    def memory_extra(self) -> dict[str, int]:
        """What Backend.memory reports beside the parameters', gradients' and optimizer's bytes."""
        return {}

    def full_state(self, model: keras.Model) -> Mapping[str, Any]:
        """The model's unsharded variables by path (every rank calls it: a collective is allowed);
        parallel.tensor: its slices gathered (over the tensor group)."""
        if self.replicas:
            return self.replicas.gather([(v.path, v.path, v) for v in model.variables])
        return {v.path: v for v in model.variables}

    def held_grads(self) -> int:
        # Gradients live only inside the compiled step, one per trained variable, of its shape
        # and dtype: counted from the variables.
        return variable_bytes(self.variables)
