"""The one contract between the framework-free core and a framework backend.

The core owns the epoch loop, the learning-rate schedule, sharding, metrics, checkpoint
cadence and outputs; a backend owns tensors: the model, the optimizer, Horovod's binding and
the data loader. `torch_backend/backend.py` and `tf_backend/backend.py` implement it, and
`hvdcls.registry.create_backend(name)` picks one by name. Both build on
`hvdcls.horovod_backend.HorovodBackend`, which implements once what needs only Horovod
(init, the context, the object and metric collectives, elastic_run, communication).

Step results are framework scalars (tensors): the core adds them with `+` and converts with
`float()` only when it logs, so a step never waits on the device just to be counted.
"""
from __future__ import annotations

import abc
import dataclasses
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, Mapping, NamedTuple, Optional

from hvdcls.config import Config

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # one per boot of a kernel (Linux)

if TYPE_CHECKING:  # the contract names the batches type; the core's data layer sits above it
    from hvdcls.data.batches import EpochBatches, LoaderWait


@dataclass(frozen=True)
class Context:
    """Who this process is, made once after hvd.init(); everything else receives it."""

    backend: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    controller: str  # gloo | mpi
    device: str  # cpu | cuda:N
    threads: int
    versions: dict = field(default_factory=dict)
    # This host as the launcher names it (horovodrun's -H or discovery, so a job's hosts read as
    # its allocation does), else the machine's own name.
    host: str = field(default_factory=socket.gethostname)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class Sums(NamedTuple):
    """Per-batch sums; framework scalars from a step, floats once reduced."""

    loss: Any  # sum over samples of the loss
    correct: Any
    count: Any


class EvalSums(NamedTuple):
    """A validation batch's sums: Sums' three, the top-5 hits and the confusion counts, so
    that top-5 and the per-class figures are reduced over the ranks as exactly as accuracy."""

    loss: Any
    correct: Any
    count: Any
    top5: Any  # samples whose class is among the TOP_K highest logits
    confusion: Any  # classes x classes counts, flat (true class x classes + predicted)


TOP_K = 5  # hvdcls.observe.classification.TOP_K: top-5, reported with more classes than that


def add(total, step):
    """Running sums (Sums or EvalSums) in the framework's own dtypes (starting from the first
    step's, not 0.0: TensorFlow will not add a Python float to an int32 tensor)."""
    return step if total is None else type(step)(*(a + b for a, b in zip(total, step)))


class Backend(abc.ABC):
    """Everything the core calls on a backend; the methods with a body are optional."""

    name: str

    @abc.abstractmethod
    def init(self, config: Config) -> Context:
        """hvd.init(), threads, device; returns this process's Context."""

    @abc.abstractmethod
    def build(self, config: Config, num_classes: int) -> dict:
        """Make model + optimizer, wrap them for Horovod and broadcast rank 0's initial state.

        Returns a description for summary.json (model parameters, Horovod settings in force).
        An unknown model name is a UserError. With training.elastic the broadcast is left to
        the elastic state's sync: a worker joining later must run no collective of its own.
        """

    @abc.abstractmethod
    def loader(self, batches: EpochBatches, workers: int) -> Iterable:
        """Iterate the batches as framework tensors, reading with `workers` parallel workers."""

    @abc.abstractmethod
    def train_step(self, micro_batches: list, lr: float, weight: float = 1.0) -> Sums:
        """Forward/backward every micro-batch, all-reduce the gradients once, step. `weight`
        multiplies this rank's mean loss before backward (so before any compression):
        ranks x b_i / B under training.balance, making the average the global batch's mean."""

    @abc.abstractmethod
    def eval_step(self, batch) -> EvalSums:
        """Loss, correct predictions, top-5 hits and confusion counts of one batch, in
        inference mode (the counts on the host: the loop reduces them once per evaluation)."""

    @abc.abstractmethod
    def allreduce_sum(self, values: list[float], name: str) -> list[float]:
        """Sum floats over all ranks (exact metric reduction)."""

    @abc.abstractmethod
    def broadcast_object(self, obj: Any, name: str) -> Any:
        """Rank 0's picklable `obj`, on every rank."""

    @abc.abstractmethod
    def allgather_object(self, obj: Any, name: str) -> list:
        """Every rank's picklable `obj`, in rank order, on every rank."""

    @abc.abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's own generators (dropout and the like)."""

    @abc.abstractmethod
    def sync_buffers(self) -> None:
        """Average non-trained state (batch-norm running statistics) over ranks, so that
        evaluation and checkpoints see the same model on every rank."""

    @abc.abstractmethod
    def save(self, directory: Path) -> None:
        """Write model and optimizer state into `directory` (rank 0; the core renames it)."""

    @abc.abstractmethod
    def load(self, directory: Path) -> None:
        """Read what save() wrote (rank 0 only); follow with broadcast_state()."""

    @abc.abstractmethod
    def broadcast_state(self) -> None:
        """Rank 0's model and optimizer state, on every rank."""

    @abc.abstractmethod
    def weights(self) -> Mapping[str, Any]:
        """Model state (trained weights and buffers) as numpy arrays, by name: a LazyArrays,
        each array made (a host copy) when it is read."""

    @abc.abstractmethod
    def memory(self) -> dict[str, int]:
        """This rank's bytes in tensors, counted from them (numel x element size):
        `param_bytes` (trainable parameters), `grad_bytes` (their gradients) and
        `optimizer_state_bytes` (the per-parameter state: momentum buffers, Adam's moments;
        0-d bookkeeping such as step counters, the learning rate or the loss scale is left
        out). hvdcls.training.memory adds the process's peak RSS for summary.json."""

    @abc.abstractmethod
    def elastic_state(self, progress: dict) -> Any:
        """A Horovod elastic State holding the model, the optimizer and `progress` (picklable
        values, read and set as attributes): saved by commit(), put back on a worker failure,
        broadcast from rank 0 on every (re)start."""

    @abc.abstractmethod
    def elastic_run(self, state: Any, attempt: Callable[[Any, Context], Any]) -> Any:
        """Call attempt(state, context) under Horovod's elastic retry: after a worker fails or
        hosts change, Horovod is re-initialised, `state` restored and synced, and `attempt`
        called again with the new world's Context. Returns the last attempt's result."""

    # The watchdog's view of a step (hvdcls.training.watchdog): a backend that can tell when its
    # step stops computing and starts waiting for the all-reduced gradients sets
    # `marks_allreduce_wait` and calls `waiting_for_allreduce()` there; the loop sets the hook.
    marks_allreduce_wait = False
    allreduce_wait_hook: Optional[Callable[[], None]] = None

    def loader_worker(self, loader: LoaderWait, batches: EpochBatches) -> Optional[str]:
        """Which of the loader's workers holds the batch `loader` waits for, in a few words
        ("loader worker 1, pid 4242"); None where this thread reads it or nobody can tell.
        Asked from the watchdog's thread when this rank is stuck reading data, so it only
        looks. Here: a worker thread of this process reading it (tf.data's parallel map)."""
        reader = batches.readers.get(loader.taken)
        if reader is None or reader == threading.main_thread().native_id:
            return None
        return f"loader worker thread {reader}"

    def waiting_for_allreduce(self) -> None:
        if self.marks_allreduce_wait and self.allreduce_wait_hook is not None:
            self.allreduce_wait_hook()

    def ema_update(self, decay: float) -> None:
        """Model EMA (built when training.ema_decay is set): ema = decay x ema + (1 - decay)
        x weights, for the parameters and floating buffers; decay 0 copies the weights. The
        EMA copy is saved, loaded, broadcast and (its buffers) averaged with the model's."""
        raise NotImplementedError(f"{self.name} backend has no model EMA")

    def ema_weights(self) -> ContextManager[None]:
        """A context manager: inside it the model holds the EMA weights (eval_step and
        weights() see them); the trained weights are put back when it exits."""
        raise NotImplementedError(f"{self.name} backend has no model EMA")

    def set_frozen(self, frozen: bool) -> None:
        """training.freeze_epochs, at an epoch boundary (every rank alike): frozen, everything
        but the classifier head takes no gradient, no optimizer update and no part in the
        gradient exchange; unfrozen, all trains. build() leaves the model frozen when
        freeze_epochs > 0 (the range test sweeps that phase); the loop sets it each epoch, so a
        resumed run is frozen exactly when its epoch is."""
        if frozen:
            raise NotImplementedError(f"{self.name} backend cannot freeze layers")

    def set_class_weights(self, weights: Optional[list[float]]) -> None:
        """training.class_weights: the training loss weighs each sample by its class's weight,
        as torch's CrossEntropyLoss(weight=...) (sum of w[y] x loss over sum of w[y]); None: all 1.
        Set before the first training step (and the range test's)."""
        if weights is not None:
            raise NotImplementedError(f"{self.name} backend has no class weights")

    def snapshot(self) -> Any:
        """This rank's training state in memory, for restore() to put back exactly: the model
        (weights and buffers), the optimizer (its slots and step counts), the loss scaler,
        PowerSGD's state and the communication counts. The learning-rate range test
        (hvdcls.training.lr_sweep) trains on a snapshot and restores it; no collective."""
        raise NotImplementedError(f"{self.name} backend has no snapshot")

    def restore(self, snapshot: Any) -> None:
        """Put back what snapshot() took, bit for bit (the model EMA, untouched by the
        sweep, is not part of it)."""
        raise NotImplementedError(f"{self.name} backend has no snapshot")

    def allreduce_wait_seconds(self) -> Optional[float]:
        """Seconds the last train_step blocked waiting for its gradient all-reduce once the
        backward pass was done (Horovod overlaps the rest with backward), measured on the
        host; None where the backend cannot time it apart from the rest of the step."""
        return None

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        """Called on every rank before rank 0 saves: make rank 0's state stand for all ranks
        (a collective, where per-rank state exists: PowerSGD's error feedback). training.zero's
        optimizer-state slices: with `shard_dir` (rank 0's checkpoint directory, which every
        rank sees) each rank writes its own there; without, they are gathered to rank 0 into
        the unsharded layout."""
        return None

    def share_cores(self, config: Config, processes: int) -> Optional[int]:
        """`processes` ranks of this world, this one among them, compute on this process's
        cores (counted by cores_key, not by host name): the threads it computes on from now
        on, None where they do not change."""
        return None

    def communication(self) -> Optional[dict]:
        """Gradient bytes all-reduced so far, counted from the tensors sent
        (hvdcls.maths.powersgd.ByteCounter.summary()); None where the backend does not count.
        Under parallel.tensor also `tensor_parallel_bytes_per_step` and
        `tensor_parallel_seconds_per_step`: the last step's activation sums within the tensor
        group (hvdcls bench reads them)."""
        return None

    def saved_activation_bytes(self, step: Callable[[], Any]) -> Optional[int]:
        """Runs `step` (one training step) and returns the bytes of the activations the
        framework kept for the backward pass during it, each storage once, the parameters not
        counted (hvdcls bench's activation memory); None where the backend cannot count them."""
        step()
        return None

    @abc.abstractmethod
    def profiler(self, directory: Path) -> ContextManager[None]:
        """A context manager: profile what runs inside it with the framework's profiler and
        write the trace into `directory` (which exists) when it exits."""


def usable_cores() -> tuple[int, ...]:
    """The CPUs this process may run on (a container's or a job's CPU set)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def threads_per_process(config: Config, sharing: int) -> int:
    """training.threads, else this machine's usable cores shared among `sharing` ranks."""
    if config.training.threads:
        return config.training.threads
    return max(1, len(usable_cores()) // max(1, sharing))


def cores_key() -> tuple[str, tuple[int, ...]]:
    """The cores this process computes on: the kernel it runs under (its boot id, the same in
    every container on one machine and under every name the machine is given) and the CPUs it
    may use there. Ranks with the same key share those cores, where Horovod's local size
    counts only the ranks launched under one host name."""
    try:
        kernel = BOOT_ID.read_text().strip()
    except OSError:  # not Linux: the host name is the best there is
        kernel = socket.gethostname()
    return kernel, usable_cores()


def share_cores(backend: Backend, ctx: Context, config: Config) -> Context:
    """The backend told how many ranks of this world compute on this process's cores; the
    context with the threads it computes on now. Without it, two ranks on one machine under
    two names (two containers of the compose cluster, or localhost and 127.0.0.1) each took
    every core: a torch epoch of the digits at np=2 took 5-13 s instead of under 0.9 on 2
    cores (docs/horovod-settings.md). A collective: every rank calls it, or none does."""
    if ctx.size == 1 or config.training.threads:
        return ctx
    mine = cores_key()
    threads = backend.share_cores(config, backend.allgather_object(mine, "hvdcls.cores").count(mine))
    return ctx if threads is None else dataclasses.replace(ctx, threads=threads)


class LazyArrays(Mapping[str, Any]):
    """Arrays by name, each made by its function when it is read: a walk over them (a digest)
    holds one host copy at a time. TensorFlow's variables copied all at once, ViT-H/14's
    2.5 GB on each rank, killed a run that had trained and saved under a 22 GB limit."""

    def __init__(self, makers: dict[str, Callable[[], Any]]):
        self.makers = makers

    def __getitem__(self, name: str) -> Any:
        return self.makers[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self.makers)

    def __len__(self) -> int:
        return len(self.makers)

    def copied(self) -> dict[str, Any]:
        """Every array, copied now (to compare with later: a read of this mapping is live)."""
        import numpy as np

        return {name: np.array(make()) for name, make in self.makers.items()}


def weights_digest(weights: Mapping[str, Any]) -> str:
    """sha256 over a model's arrays (by name, as float32): equal digests, equal models."""
    import hashlib

    import numpy as np

    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(weights[name], np.float32).data)
    return digest.hexdigest()
