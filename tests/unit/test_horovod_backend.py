"""hvdcls.horovod_backend.HorovodBackend over a fake binding: what a framework backend must
implement, and that the shared part calls the binding as each backend used to."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from hvdcls import config as cfg
from hvdcls.backend import Backend, Context, cores_key, share_cores
from hvdcls.horovod_backend import HorovodBackend
from hvdcls.maths.powersgd import ByteCounter

# The framework's part: the contract's tensor-owning methods and the shared code's two hooks.
FRAMEWORK_PART = {"setup", "float64_tensor", "build", "loader", "train_step", "eval_step", "seed",
                  "sync_buffers", "save", "load", "broadcast_state", "weights", "elastic_state",
                  "profiler", "memory"}
# What the core calls on a backend (hvdcls.training, hvdcls.bench).
CORE_CALLS = {"init", "build", "loader", "train_step", "eval_step", "allreduce_sum", "broadcast_object",
              "allgather_object", "seed", "sync_buffers", "save", "load", "broadcast_state", "weights",
              "elastic_state", "elastic_run", "allreduce_wait_seconds", "prepare_checkpoint",
              "communication", "profiler", "memory", "snapshot", "restore", "share_cores", "set_frozen",
              "set_class_weights"}


class FakeBinding(SimpleNamespace):
    """The few horovod.torch / horovod.tensorflow functions the shared part may use: rank 1 of
    a world of 3 (2 on this host), every peer contributing the same values."""

    Sum = "Sum"

    def __init__(self, **kwargs):
        super().__init__(calls=[], started=0, rank=lambda: 1, size=lambda: 3, local_rank=lambda: 1,
                         local_size=lambda: 2, mpi_enabled=lambda: False, **kwargs)

    def init(self):
        self.started += 1
        self.calls.append("init")

    def shutdown(self):
        self.calls.append("shutdown")

    def allreduce(self, tensor, op, name):
        self.calls.append(("allreduce", op, name, tensor.dtype))
        return tensor * self.size()

    def broadcast_object(self, obj, root_rank, name):
        self.calls.append(("broadcast_object", root_rank, name))
        return obj

    def allgather_object(self, obj, name):
        self.calls.append(("allgather_object", name))
        return [obj] * self.size()


class FakeBackend(HorovodBackend):
    name = "fake"

    def __init__(self, hvd):
        super().__init__(hvd, {"fakeframework": "1.0"})

    def setup(self, config, local_rank, threads):
        self.setup_args = (local_rank, threads)
        return f"fakedevice:{local_rank}"

    def float64_tensor(self, values):
        return np.array(values, np.float64)

    # The tensor-owning methods are not under test: plain attributes make the class concrete.
    build = loader = train_step = eval_step = seed = sync_buffers = save = load = None
    broadcast_state = weights = elastic_state = profiler = memory = None


def config(**training) -> cfg.Config:
    return cfg.load(overrides=[f"training.{key}={value}" for key, value in training.items()])


def test_a_framework_backend_implements_the_framework_part_only():
    assert set(HorovodBackend.__abstractmethods__) == FRAMEWORK_PART
    assert len(FRAMEWORK_PART) <= 15  # memory (issue 28) made it 15


def test_the_core_can_still_call_every_method_it_calls():
    assert CORE_CALLS <= {name for name in dir(Backend) if not name.startswith("_")}
    assert CORE_CALLS <= {name for name in dir(HorovodBackend) if not name.startswith("_")}


def test_init_starts_horovod_then_the_framework_and_describes_the_process(monkeypatch):
    monkeypatch.setattr("hvdcls.horovod_backend.metadata.version", lambda package: f"{package}-v")
    hvd = FakeBinding()
    backend = FakeBackend(hvd)
    ctx = backend.init(config(threads=3))
    assert hvd.calls == ["init"] and backend.setup_args == (1, 3)
    assert ctx == Context("fake", 1, 3, 1, 2, "gloo", "fakedevice:1", 3,
                          {"fakeframework": "1.0", "horovod": "horovod-v"})
    hvd.mpi_enabled = lambda: True
    assert backend.context().controller == "mpi"


def test_collectives_go_through_the_binding():
    hvd = FakeBinding()
    backend = FakeBackend(hvd)
    summed = backend.allreduce_sum([0.5, 2.0], "metrics")
    assert summed == [1.5, 6.0] and all(type(v) is float for v in summed)
    assert backend.broadcast_object({"a": 1}, "outcome") == {"a": 1}
    assert backend.allgather_object("host", "rank_hosts") == ["host"] * 3
    assert hvd.calls == [("allreduce", "Sum", "metrics", np.float64), ("broadcast_object", 0, "outcome"),
                         ("allgather_object", "rank_hosts")]


def test_communication_is_the_counter_the_backend_set():
    backend = FakeBackend(FakeBinding())
    assert backend.communication() is None
    backend.counter = ByteCounter(100)
    backend.counter.add(25)
    assert backend.communication()["compression_ratio"] == 4.0


def test_elastic_run_restores_resets_and_calls_again_with_the_new_world():
    pytest.importorskip("horovod.common.elastic")
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HorovodInternalError

    hvd = FakeBinding()
    backend = FakeBackend(hvd)
    backend.init(config(threads=1))
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, step=0)
    sizes = []

    def attempt(state, ctx):
        sizes.append(ctx.size)
        if len(sizes) == 1:
            state.step = 5  # not committed: lost when the world breaks
            hvd.size = lambda: 2  # the world the reset joins
            raise HorovodInternalError("a peer died")
        return state.step

    assert backend.elastic_run(state, attempt) == 0
    assert sizes == [3, 2] and hvd.calls == ["init", "shutdown", "init"]


def test_elastic_run_translates_the_framework_failures_the_backend_names():
    pytest.importorskip("horovod.common.elastic")
    from contextlib import contextmanager

    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HorovodInternalError

    class FrameworkError(Exception):
        pass

    class Translating(FakeBackend):
        @contextmanager
        def collective_failures(self):
            try:
                yield
            except FrameworkError as err:
                raise HorovodInternalError(err) from err

    backend = Translating(FakeBinding())
    backend.init(config(threads=1))
    failures = iter([FrameworkError("HorovodAllreduce failed")])

    def attempt(state, ctx):
        for failure in failures:
            raise failure
        return "done"

    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0)
    assert backend.elastic_run(state, attempt) == "done"
    assert backend.hvd.calls == ["init", "shutdown", "init"]


def test_elastic_run_lets_any_other_error_end_the_run():
    pytest.importorskip("horovod.common.elastic")
    from horovod.common.elastic import ObjectState

    backend = FakeBackend(FakeBinding())
    backend.init(config(threads=1))

    def attempt(state, ctx):
        raise ValueError("a bug, not a failed peer")

    with pytest.raises(ValueError):
        backend.elastic_run(ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0), attempt)
    assert backend.hvd.calls == ["init"]


def test_the_weights_digest_reads_lazy_arrays_one_at_a_time_and_names_what_differs():
    """The ranks' digests (summary.json) are taken from a LazyArrays: each variable's host copy
    is made when read and dropped before the next (all at once killed a ViT-H/14 run); equal
    arrays give the digest a dict gives, a changed element or name another."""
    import weakref

    import numpy as np

    from hvdcls.backend import LazyArrays, weights_digest

    plain = {"b": np.arange(4, dtype=np.float64), "a": np.ones((2, 3), np.float32)}
    made: list = []

    def maker(name):
        def make():
            assert all(ref() is None for ref in made), "an earlier copy is still alive"
            copy = np.array(plain[name])
            made.append(weakref.ref(copy))
            return copy
        return make

    lazy = LazyArrays({name: maker(name) for name in plain})
    assert weights_digest(lazy) == weights_digest(plain) and len(made) == 2
    assert sorted(lazy) == ["a", "b"] and len(lazy) == 2
    copies = lazy.copied()
    plain["a"][1, 2] = 0.5
    assert weights_digest(plain) != weights_digest(copies)  # copied() is a copy, not a view
    assert weights_digest({"c": plain["a"], "b": plain["b"]}) != weights_digest(plain)


class Resizable(FakeBackend):
    """A framework whose pool takes a new size at any time (torch); FakeBackend's cannot (TF)."""

    def set_threads(self, threads):
        self.resized = threads
        return True


def keys_of(*keys):
    """An allgather of cores_key: rank 1 (this process) answers its own; the others are given."""
    return lambda obj, name: [keys[0], obj, *keys[1:]]


def test_ranks_on_one_kernel_share_its_cores_whatever_their_host_names(monkeypatch):
    mine = ("boot-a", (0, 1, 2, 3))
    monkeypatch.setattr("hvdcls.backend.usable_cores", lambda: mine[1])
    monkeypatch.setattr("hvdcls.backend.cores_key", lambda: mine)
    hvd = FakeBinding()
    hvd.local_size = lambda: 1  # rank 1 of 3, the only rank launched under its host name
    backend = Resizable(hvd)
    ctx = backend.init(config())
    assert backend.setup_args == (1, 4) and ctx.threads == 4  # by host name: every core
    hvd.allgather_object = keys_of(mine, ("boot-b", (0, 1, 2, 3)))  # rank 0 here under another name
    shared = share_cores(backend, ctx, config())
    assert (shared.threads, backend.resized, backend.context().threads) == (2, 2, 2)
    assert share_cores(backend, shared, config()) is shared  # told nothing new: nothing changes
    # a world where the other rank here has CPUs of its own (a container's CPU set): all 4 again
    hvd.allgather_object = keys_of(("boot-a", (4, 5)), ("boot-b", (0, 1, 2, 3)))
    assert share_cores(backend, shared, config()).threads == 4 and backend.resized == 4


def test_cores_are_not_reshared_where_they_cannot_be_or_need_not_be(monkeypatch):
    monkeypatch.setattr("hvdcls.backend.usable_cores", lambda: (0, 1))
    hvd = FakeBinding()
    hvd.local_size = lambda: 1
    fixed = FakeBackend(hvd)  # TensorFlow: its pools are sized once
    ctx = fixed.init(config())
    hvd.allgather_object = keys_of(cores_key(), cores_key())
    assert share_cores(fixed, ctx, config()) is ctx and fixed.context().threads == 2

    def no_collective(obj, name):
        raise AssertionError("a collective where none was needed")

    hvd.allgather_object = no_collective
    assert share_cores(fixed, ctx, config(threads=2)) is ctx  # training.threads decides
    alone = dataclasses.replace(ctx, size=1)
    assert share_cores(fixed, alone, config()) is alone
    kernel, cores = cores_key()
    assert kernel and kernel == cores_key()[0] and cores == (0, 1)  # the boot id, read again alike
