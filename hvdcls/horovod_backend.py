"""What every backend does the same way over Horovod, written once.

`horovod.torch` and `horovod.tensorflow` share Horovod's basics (`HorovodBasics`: init, rank,
size, local rank, the controller) and the object collectives (`broadcast_object`,
`allgather_object`); the elastic retry loop (`horovod.common.elastic.run_fn`) is the same for
both. `HorovodBackend` implements the contract's parts that rest only on those, given the
binding module by the framework backend (the core imports no binding), and leaves the
framework's part abstract: model, steps, data, state, profiler, and three small hooks
(`setup`, `float64_tensor`, `collective_failures`).
"""
from __future__ import annotations

import abc
import os
import socket
import time
from contextlib import nullcontext
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ContextManager, Iterable, Optional

from hvdcls.backend import Backend, Context, threads_per_process
from hvdcls.config import Config
from hvdcls.maths.powersgd import ByteCounter
from hvdcls.strategy import Strategy

# horovod.wait=sleep: the nap between two polls of an unfinished handle. A waiting rank wakes
# about once a millisecond, short against a step with megabytes to all-reduce (ResNet-50 at
# np=2 ran alike with naps of 0.5 to 4 ms; docs/benchmarks.md).
WAIT_NAP_SECONDS = 1e-3
# horovod.wait=auto sleeps when a step's gradients are larger than this, else spins. Measured
# at np=2 on 2 cores (docs/horovod-settings.md): sleeping won 5-13 % with ResNet-18's 45 MB and
# ResNet-50's 94 MB, whose all-reduce keeps Horovod's thread busy for tens of milliseconds;
# it lost 10-18 % with a 0.3 MB CNN, whose wait is the background cycle's latency, where a
# nap's overshoot costs and the spin takes nothing from a thread with work to do.
AUTO_SLEEP_ABOVE_BYTES = 16 * 2**20


_SETS: dict[tuple[int, ...], Any] = {}  # Horovod's ProcessSet per rank tuple, made once per process


def process_set(binding: ModuleType, ranks: tuple[int, ...], every: Iterable[tuple[int, ...]]) -> Any:
    """Horovod's set of `ranks` (parallel.tensor's): the global one for the whole world, else
    one made here the first time (every rank makes all of `every`, in one order: a collective;
    the binding's init took process_sets="dynamic")."""
    if ranks == tuple(range(binding.size())):
        return binding.global_process_set
    for each in every:
        if each not in _SETS:
            _SETS[each] = binding.add_process_set(list(each))  # Horovod
    return _SETS[ranks]


class TensorPlace:
    """One rank's place in parallel.tensor's layout (hvdcls.maths.tensor_parallel.Layout) and
    its Horovod sets; the backends' TensorParallel add their collectives."""

    def __init__(self, binding: ModuleType, layout: Any, rank: int):
        every = layout.process_sets()
        self.layout, self.rank, self.t = layout, rank, layout.tensor_rank(rank)
        self.group = process_set(binding, layout.group(rank), every)  # its tensor group
        self.data_set = process_set(binding, layout.data_set(rank), every)  # the ranks holding its slices
        self.data_root = layout.data_set(rank)[0]  # its replica-0 rank
        self.whole: Optional[dict] = None  # rank 0 after reading a checkpoint, until it is dealt


def waits_asleep(wait: str, gradient_bytes: int) -> bool:
    """horovod.wait (auto, sleep or spin) for a model whose gradients are `gradient_bytes`."""
    return wait == "sleep" or (wait == "auto" and gradient_bytes > AUTO_SLEEP_ABOVE_BYTES)


def sleep_until_done(handles: Iterable[Any], poll: Callable[[Any], bool],
                     nap: float = WAIT_NAP_SECONDS) -> None:
    """Sleep until `poll` says each handle is done, so that the binding's own synchronize()
    then finds nothing left to wait for. Horovod's synchronize() loops on `yield` instead: with
    one core a rank, that loop competes for the core with the threads that finish the
    all-reduce it waits for (docs/horovod-settings.md)."""
    for handle in handles:
        while not poll(handle):
            time.sleep(nap)


class HorovodBackend(Backend):
    """A Backend over one Horovod binding (`self.hvd`), as `HorovodBasics` is over one library.

    A framework backend passes its binding and its framework's versions to __init__ and
    implements what is still abstract; its build() sets `self.strategy`, the reduction mode
    (hvdcls.strategy), and `self.counter`, where it counts the gradient bytes it sends.
    """

    counter: Optional[ByteCounter] = None
    strategy: Optional[Strategy] = None

    def __init__(self, hvd: ModuleType, versions: dict[str, str]):
        self.hvd = hvd  # horovod.torch or horovod.tensorflow
        self.versions = versions  # the framework's packages, for Context.versions

    # -- the framework's part: hooks the shared code below calls --

    @abc.abstractmethod
    def setup(self, config: Config, local_rank: int, threads: int) -> Any:
        """Run the framework's CPU ops on `threads` threads and pick this process's device
        (training.device; one GPU per local rank). Returns the device, kept as self.device."""

    @abc.abstractmethod
    def float64_tensor(self, values: list[float]) -> Any:
        """`values` as a 1-D float64 tensor of the framework, on the host: what the binding's
        hvd.allreduce takes."""

    def set_threads(self, threads: int) -> bool:
        """Compute on `threads` threads from now on; False where the framework cannot
        change them once it has started."""
        return False

    def collective_failures(self) -> ContextManager[None]:
        """A context manager turning a failed collective, as the framework reports it, into
        Horovod's HorovodInternalError, the one error the elastic loop recovers from. Nothing
        to do where the binding raises HorovodInternalError itself (horovod.torch)."""
        return nullcontext()

    # -- the contract, implemented once --

    def init(self, config: Config) -> Context:
        # Horovod: start the background thread and learn rank and size; parallel.tensor makes
        # its process sets once the size is known (every rank the same, in one order)
        self.hvd.init(**({"process_sets": "dynamic"} if config.parallel.tensor > 1 else {}))
        self.threads = threads_per_process(config, self.hvd.local_size())
        self.device = self.setup(config, self.hvd.local_rank(), self.threads)
        return self.context()

    def share_cores(self, config: Config, processes: int) -> Optional[int]:
        threads = threads_per_process(config, max(processes, self.hvd.local_size()))
        if threads == self.threads or not self.set_threads(threads):
            return None
        self.threads = threads
        return threads

    def context(self) -> Context:
        """Who this process is now (rank and size change after an elastic reset)."""
        hvd = self.hvd
        controller = "mpi" if hvd.mpi_enabled() else "gloo"
        return Context(self.name, hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                       controller, str(self.device), self.threads,
                       {**self.versions, "horovod": metadata.version("horovod")},
                       # Horovod's gloo launcher (static and elastic) names each worker's host
                       os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())

    def allreduce_sum(self, values: list[float], name: str) -> list[float]:
        import numpy as np  # both bindings return a host tensor numpy can read

        reduced = self.hvd.allreduce(self.float64_tensor(values), op=self.hvd.Sum, name=name)
        return np.asarray(reduced).tolist()

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=0, name=name)

    def allgather_object(self, obj: Any, name: str) -> list:
        return self.hvd.allgather_object(obj, name=name)

    def communication(self) -> Optional[dict]:
        if self.strategy is not None:  # its counter's, and what else it sends (parallel.tensor's sums)
            return self.strategy.communication()
        return self.counter.summary() if self.counter is not None else None

    def prepare_checkpoint(self, shard_dir: Optional[Path] = None) -> None:
        if self.strategy is not None:  # what it holds per rank: ZeRO's slices, PowerSGD's errors
            self.strategy.prepare_checkpoint(shard_dir)
        self.prepare_ema_checkpoint()

    def prepare_ema_checkpoint(self) -> None:
        """parallel.tensor with training.ema_decay: the EMA copy's slices gathered whole for rank
        0's save (a collective of replica 0's group); else nothing."""

    def elastic_run(self, state: Any, attempt: Callable[[Any, Context], Any]) -> Any:
        # Horovod's own retry loop, the one both bindings' hvd.elastic.run wrap. Imported here:
        # the core loads no Horovod at import time; by now the backend has loaded the binding.
        from horovod.common.elastic import run_fn

        def once(current):
            with self.collective_failures():
                return attempt(current, self.context())

        return run_fn(once, self._reset)(state)

    def _reset(self) -> None:
        """Horovod: leave the broken world and join the new one (what hvd.elastic.run does)."""
        self.hvd.shutdown()
        self.hvd.init()
