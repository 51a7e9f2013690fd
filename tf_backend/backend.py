"""The TensorFlow backend: horovod.tensorflow's DistributedGradientTape around a Keras 3 model.

Mirror: torch_backend/backend.py. Lines that exist only for distribution say `# Horovod:`.
What needs only Horovod (init, context, object and metric collectives, elastic_run) is
hvdcls.horovod_backend.HorovodBackend's, given horovod.tensorflow here. allreduce_wait_seconds
is the contract's None by default: the all-reduce runs inside the compiled step
(DistributedGradientTape in a tf.function), interleaved with the backward pass, and timing
it apart would mean a different step; Horovod's timeline measures it (`hvdcls timeline PATH`).
The watchdog still learns where the step is: a mark in the compiled step (`_backward_done`)
fires once every local gradient exists, and nothing waits for it, so the all-reduce overlaps
backward as before; from the mark on the rank is "waiting in the all-reduce".
With training.balance=dynamic the balancer needs each rank's compute time too: the same mark
notes the host time, and the step all-reduces each gradient as DistributedGradientTape would,
in the same compiled call, so the all-reduce still overlaps the backward pass and the wait is
the time from the mark to the step's end.

Keras 3 note: Horovod's helpers expect `tf.Variable`s but Keras 3 hands out its own
variables (`broadcast_variables` fails with "'SymbolicTensor' object has no attribute
'assign'", `DistributedGradientTape` with "no attribute 'ref'"). We pass the underlying
`tf.Variable`s, `v.value`, everywhere Horovod sees a variable.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import time
import zipfile
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Sequence

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdcls import strategy
from hvdcls.backend import TOP_K, EvalSums, LazyArrays, Sums, add
from hvdcls.config import Config, worker_lr
from hvdcls.data import device_decode
from hvdcls.data.batches import EpochBatches
from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.horovod_backend import HorovodBackend
from hvdcls.maths import powersgd
from tf_backend import (
    compiled,
    data,
    decode,
    elastic,
    finetune,
    models,
    optimizers,
    recompute,
    sync_bn,
    tensor_parallel,
)
from tf_backend.activations import saved_bytes
from tf_backend.strategies import check_count, tf_variables, variable_bytes
from tf_backend.weights import CHECKPOINT_FILE, load_initial_weights, refresh_normalization

# The optimizers whose weight decay is L2 added to the gradient here, as torch's SGD and Adam
# add it; the others (adamw, lars, lamb) apply their own.
L2_ON_GRADIENT = ("sgd", "adam")


def host_copy(variable) -> np.ndarray:
    """A variable's (or zero=3's gathered array's) host copy, as float32."""
    return np.asarray(variable if isinstance(variable, np.ndarray) else variable.numpy(), np.float32)


def make_optimizer(config: Config, scales: Optional[Sequence[float]] = None) -> keras.optimizers.Optimizer:
    """Same update rules as torch_backend: SGD and Adam take weight decay as L2 on the gradient
    (added in train step), AdamW decouples it, LARS and LAMB apply their own (not to 1-D weights).
    `scales`: each variable's rate multiplier (optimizer.layer_decay), in the order it is built on."""
    opt, lr = config.optimizer, worker_lr(config.optimizer, config.training.batch_size)
    kind, options = {
        "sgd": (keras.optimizers.SGD, {"momentum": opt.momentum, "nesterov": opt.nesterov}),
        "adam": (keras.optimizers.Adam, {"epsilon": 1e-8}),
        "lars": (optimizers.LARS, {"momentum": opt.momentum, "weight_decay": opt.weight_decay,
                                   "trust_coefficient": opt.trust_coefficient, "nesterov": opt.nesterov}),
        "lamb": (optimizers.LAMB, {"weight_decay": opt.weight_decay}),
    }.get(opt.name, (keras.optimizers.AdamW, {"weight_decay": opt.weight_decay, "epsilon": 1e-8}))
    if scales is not None:
        kind = finetune.with_layer_rates(kind, scales)
    return kind(lr, **options)


def amp_policy(config: Config, on_gpu: bool) -> str | None:
    if not config.training.amp:
        return None
    name = config.training.amp_dtype
    if name == "auto":
        name = "float16" if on_gpu else "bfloat16"
    return f"mixed_{name}"


def pick_device(config: Config, local_rank: int) -> str:
    gpus = tf.config.list_physical_devices("GPU")
    wanted = config.training.device
    if wanted == "cuda" and not gpus:
        raise UserError("training.device=cuda but TensorFlow sees no GPU (tensorflow-cpu installed?)")
    if gpus and wanted != "cpu":
        gpu = gpus[local_rank % len(gpus)]  # Horovod: one GPU per process, by local rank
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
        return f"cuda:{local_rank % len(gpus)}"
    tf.config.set_visible_devices([], "GPU")
    return "cpu"


class TensorFlowBackend(HorovodBackend):
    name = "tensorflow"
    marks_allreduce_wait = True  # the watchdog's phases: `_backward_done` (read when traced)
    counter: powersgd.ByteCounter
    strategy: Any  # hvdcls.strategy: the reduction mode (tf_backend/strategies/), chosen in build
    class_weights: Optional[list[float]]  # training.class_weights (set_class_weights)
    tensor: Optional[tensor_parallel.TensorParallel] = None  # parallel.tensor > 1: this rank's place
    # parallel.tensor: the EMA copy whole (`ema/i`), gathered for rank 0 to save or read by it to deal
    ema_whole: Optional[dict[str, np.ndarray]] = None

    def __init__(self):
        super().__init__(hvd, {"tensorflow": tf.__version__, "keras": keras.__version__})

    def setup(self, config: Config, local_rank: int, threads: int) -> str:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
        device = pick_device(config, local_rank)
        # data.decode: always the CPU here; gpu is one line (tf_backend/decode.py says why)
        device_decode.resolve(config.data.decode, device.split(":")[0], decode.unsupported())
        return device

    def set_threads(self, threads: int) -> bool:
        # TensorFlow sizes its pools once, when its runtime starts (before the first collective
        # can tell how many ranks share the cores). Two ranks of 2 threads on 2 cores lost
        # nothing measurable against 1 thread each (an elastic epoch of the digits, 0.88 against
        # 0.92 s), where torch's spinning pool lost 6x (docs/horovod-settings.md).
        return False

    def build(self, config: Config, num_classes: int) -> dict:
        hv, training = config.horovod, config.training
        compiled.refuse_what_breaks(config)  # training.compile: one line, nothing built
        policy = amp_policy(config, self.device != "cpu")
        keras.mixed_precision.set_global_policy(policy or "float32")
        self.loss_scaled = policy == "mixed_float16"
        chosen = strategy.choose(config, "tensorflow", self.loss_scaled)  # nothing built if refused
        if self.loss_scaled and training.grad_clip_norm:
            raise UserError("training.grad_clip_norm with float16 mixed precision is not supported "
                            "by the tensorflow backend: use training.amp_dtype=bfloat16")
        # training.channels_last: nothing to do, Keras convolutions are NHWC (channels last) already.
        self.model = models.build_model(config.model.name, num_classes, config.data.image_size,
                                        config.model.patch_size, models.raw_pixels(config.data.mean, config.data.std))
        # model.weights: rank 0 reads them, or in elastic mode (no collective in build) every
        # rank; the broadcast below makes the ranks alike, before the EMA copies them.
        loaded = load_initial_weights(self.model, config, hvd.rank(),
                                      None if training.elastic else self.broadcast_object)
        if hv.sync_bn:
            self.model = sync_bn.convert_sync_batchnorm(self.model)  # Horovod: global BN stats
        # parallel.tensor: every rank takes rank 0's whole model, then keeps its slices of the blocks
        self.model, self.tensor = tensor_parallel.build(self.model, config)
        if training.activation_checkpointing:  # on the final layers (the split's), before the step is traced
            recompute.enable(self.model, config.model.name)
        self.l2 = config.optimizer.weight_decay if config.optimizer.name in L2_ON_GRADIENT else 0.0
        self.clip = training.grad_clip_norm
        # the reduction mode: its optimizer, exchange and state (every rank reduces every variable)
        self.strategy = chosen(self, config, self.model.trainable_variables,
                               lambda scales=None: make_optimizer(config, scales),
                               **({"replicas": self.tensor} if self.tensor else {}))
        self.optimizer, self.counter = self.strategy.optimizer, self.strategy.counter
        self.smoothing = training.label_smoothing
        self.num_classes = num_classes
        self.timed_apart = training.balance == "dynamic"  # compute and all-reduce timed apart
        self.jit = training.compile  # XLA for the local gradients (a function the step calls)
        self.last_allreduce_wait: float | None = None
        self.backward_done_at: float | None = None  # set inside the step (`_backward_done`)
        self.ema = None
        # fine-tuning: what the step differentiates (training.freeze_epochs), the loss's weights
        self.trained, self.frozen, self.class_weights = list(self.model.trainable_variables), False, None
        self.set_frozen(training.freeze_epochs > 0)  # frozen from the start: the range test's phase too
        self._compile_steps()
        if not training.elastic:  # elastic: the state's sync broadcasts instead
            self.broadcast_state()  # Horovod: every rank starts from rank 0's weights
        refresh_normalization(self.model)  # what rank 0 loaded, on every rank (tf_backend/weights.py)
        if training.ema_decay is not None:  # from the weights every rank now has
            # Model EMA: a copy of every floating variable (weights, BN statistics).
            self.ema = [tf.Variable(tf.identity(v.value), trainable=False) for v in self.ema_sources()]
        return {"parameters": models.count_parameters(self.model), "framework": "tensorflow", "weights": loaded,
                "channels_last": True,  # Keras convolutions are NHWC whatever the key says
                "compile": training.compile, "zero": training.zero,
                "amp_dtype": policy.removeprefix("mixed_") if policy else None,
                "horovod": {"compression": hv.compression, "op": hv.op, "sync_bn": hv.sync_bn,
                            "backward_passes_per_step": hv.backward_passes_per_step}}

    def _compile_steps(self) -> None:
        self._train_one = tf.function(self._train_one_eager, reduce_retracing=True)
        self._local_grads = compiled.gradient_step(self._local_grads_eager, self.jit)
        self._apply_accumulated = tf.function(self._apply_accumulated_eager, reduce_retracing=True)
        self._eval = tf.function(self._eval_eager, reduce_retracing=True)
        self._ema_update = tf.function(self._ema_update_eager)

    def loader(self, batches: EpochBatches, workers: int):
        # uint8 pixels from the workers, normalised by a tf.data op
        return data.loader(batches, workers, uint8=isinstance(batches, EpochBatches))

    def set_frozen(self, frozen: bool) -> None:
        if frozen != self.frozen:  # a new trace: the tape's sources change
            self.trained, self.frozen = finetune.trained_variables(self.model, frozen), frozen
            self._compile_steps()

    def set_class_weights(self, weights) -> None:
        weights = None if weights is None else list(weights)
        if weights != self.class_weights:  # a new trace: the loss changes
            self.class_weights = weights
            self._compile_steps()

    def train_loss(self, labels, logits):
        """The loss trained on: class-weighted (class indices only: the config refuses mixing)."""
        if self.class_weights is None:
            return self.loss(labels, logits)
        return finetune.weighted_cross_entropy(labels, logits, self.class_weights, self.smoothing)

    def loss(self, labels, logits):
        """Mean cross-entropy, label smoothing as torch's CrossEntropyLoss does it; `labels`
        are class indices or mixed targets (N, classes) from mixup/cutmix."""
        logits = tf.cast(logits, tf.float32)
        soft = labels.dtype.is_floating  # decided when the step is traced
        if self.smoothing or soft:
            targets = labels if soft else tf.one_hot(labels, self.num_classes)
            return tf.reduce_mean(keras.losses.categorical_crossentropy(
                targets, logits, from_logits=True, label_smoothing=self.smoothing))
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

    @staticmethod
    def sums(loss, logits, labels, mark=None) -> Sums:
        """`mark`: the watchdog's (zero), carried in the count so the compiled step keeps it."""
        count = tf.shape(labels)[0] + (0 if mark is None else mark)
        dominant = tf.argmax(labels, 1) if labels.dtype.is_floating else labels  # mixed: largest share
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == dominant, tf.int32))
        return Sums(loss * tf.cast(count, tf.float32), correct, count)

    def _forward(self, images, labels, weight):
        """Logits, the mean loss, and what to differentiate: the loss times this rank's sample
        weight (training.balance; a tensor, so a new weight is no new trace), loss-scaled."""
        logits = self.model(images, training=True)
        loss = self.train_loss(labels, logits)
        objective = loss * weight
        return logits, loss, (self.optimizer.scale_loss(objective) if self.loss_scaled else objective)

    def _train_one_eager(self, images, labels, weight, warmup: bool):
        if self.jit:  # training.compile: the XLA-compiled gradients, then all-reduce and update
            grads, sums = self._local_grads(images, labels, weight)
            self._apply_accumulated_eager(grads, warmup)
            return sums
        with tf.GradientTape() as tape:
            logits, loss, scaled = self._forward(images, labels, weight)
        if self.timed_apart or not self.strategy.reduces_in_tape:
            grads = tape.gradient(scaled, self.strategy.sources(self.trained))
            # The mark: the watchdog's phase, and the balancer's time (timed_apart).
            marks = [self._mark_backward_done(grads)] if self.marks_allreduce_wait or self.timed_apart else []
            self.strategy.step(grads, warmup, overlapped=True)  # Horovod: the exchange, then the update
        else:
            tape = self.strategy.tape(tape)  # Horovod: the tape reduces the gradients it returns
            marks = self._marking(tape)
            self.apply_update(tape.gradient(scaled, self.strategy.sources(self.trained)))
        # The mark's output joins the step's, or the function would prune it.
        return self.sums(loss, logits, labels, *marks)

    def _marking(self, tape) -> list:
        """Horovod's tape with the watchdog's mark: the tape reduces the local gradients in
        `_allreduce_grads` (horovod 0.28.1's name, the last release); wrapped, the mark is
        added there, beside the all-reduce ops and not before them. Returns the list the mark
        tensor goes into when traced (empty: no mark, `marks_allreduce_wait` off)."""
        marks: list = []
        if not self.marks_allreduce_wait:
            return marks
        reduce = tape._allreduce_grads

        def reduce_marked(grads, *args):
            marks.append(self._mark_backward_done(grads))
            return reduce(grads, *args)

        tape._allreduce_grads = reduce_marked
        return marks

    def _mark_backward_done(self, grads):
        """An op that runs once every gradient in `grads` is computed and calls
        `_backward_done`; stateless, so the function's automatic control dependencies do not
        order the all-reduce ops after it, and nothing depends on it but the step's output."""
        dense = [g for g in grads if g is not None]
        with tf.control_dependencies(dense):
            probe = tf.reshape(dense[0], [-1])[:1]  # a data input too: never constant-folded
        return tf.numpy_function(self._backward_done, [probe], tf.int32, stateful=False)

    def _backward_done(self, _probe) -> np.ndarray:
        """Called by the compiled step on TensorFlow's thread when backward is done: the
        watchdog's phase, and the host time the balancer's all-reduce wait counts from."""
        self.backward_done_at = time.perf_counter()
        self.waiting_for_allreduce()
        return np.zeros((), np.int32)

    def _local_grads_eager(self, images, labels, weight):
        with tf.GradientTape() as tape:
            logits, loss, scaled = self._forward(images, labels, weight)
        grads = tape.gradient(scaled, self.strategy.sources(self.trained))
        return grads, self.sums(loss, logits, labels)

    def _apply_accumulated_eager(self, grads, warmup: bool):
        self.strategy.step(grads, warmup)  # Horovod: one exchange for the N accumulated passes

    def apply_update(self, grads) -> None:
        """The strategy's step, once the gradients are exchanged (not ZeRO's: by slices)."""
        variables = self.trained
        if self.l2:
            grads = [g + self.l2 * tf.cast(v.value, g.dtype) for g, v in zip(grads, variables)]
        if self.clip and self.tensor:  # parallel.tensor: the norm over the group's slices
            grads = self.tensor.clip_by_global_norm(grads, variables, self.clip)
        elif self.clip:
            grads, _ = tf.clip_by_global_norm(grads, self.clip)
        self.optimizer.apply_gradients(zip(grads, variables))

    def train_step(self, micro_batches: list, lr: float, weight: float = 1.0) -> Sums:
        self.optimizer.learning_rate.assign(lr)
        warmup = self.strategy.warmup()  # a Python bool (PowerSGD's warm-up): two traces
        sums = self._train_micro(micro_batches, tf.constant(weight, tf.float32), warmup)
        self.strategy.count(warmup)  # what Horovod sent, as configured
        return sums

    def _train_micro(self, micro_batches: list, weight, warmup: bool) -> Sums:
        if len(micro_batches) == 1:
            self.backward_done_at = None
            sums = self._train_one(*micro_batches[0], weight, warmup)
            if self.timed_apart and self.backward_done_at is not None:
                self.last_allreduce_wait = time.perf_counter() - self.backward_done_at  # (and the update)
            return sums
        total, accumulated = None, None
        for images, labels in micro_batches:
            grads, sums = self._local_grads(images, labels, weight)
            # Accumulated passes each carry 1/N of the step's gradient.
            scaled = [g / len(micro_batches) for g in grads]
            accumulated = scaled if accumulated is None else [a + g for a, g in zip(accumulated, scaled)]
            total = add(total, sums)
        assert total is not None and accumulated is not None  # two micro-batches or more
        if self.timed_apart:
            float(tf.reduce_sum(accumulated[0]))  # wait for the device: backward is done
            started = time.perf_counter()
        if self.marks_allreduce_wait:  # the local gradients are in: the all-reduce is next
            self.waiting_for_allreduce()
        self._apply_accumulated(accumulated, warmup)
        if self.timed_apart:
            self.last_allreduce_wait = time.perf_counter() - started  # (and the update)
        return total

    def allreduce_wait_seconds(self) -> float | None:
        return self.last_allreduce_wait

    def _eval_eager(self, images, labels):
        logits = tf.cast(self.model(images, training=False), tf.float32)
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        predicted = tf.argmax(logits, 1)
        correct = tf.reduce_sum(tf.cast(predicted == labels, tf.int32))
        classes = tf.shape(logits)[1]
        in_top = tf.math.in_top_k(tf.cast(labels, tf.int32), logits, tf.minimum(TOP_K, classes))
        top5 = tf.reduce_sum(tf.cast(in_top, tf.int32))
        cells = tf.cast(labels, tf.int32) * classes + tf.cast(predicted, tf.int32)
        confusion = tf.math.bincount(cells, minlength=classes * classes, maxlength=classes * classes,
                                     dtype=tf.int32)
        return EvalSums(loss, correct, tf.shape(labels)[0], top5, confusion)

    def eval_step(self, batch) -> EvalSums:
        return self._eval(*batch)

    def ema_sources(self) -> list:
        """The model's floating variables (Keras 3's), in the model's order."""
        return [v for v in self.model.variables if "float" in str(v.dtype)]

    def _ema_update_eager(self, decay):
        assert self.ema is not None  # build() made it (training.ema_decay)
        for average, live in zip(self.ema, tf_variables(self.ema_sources())):
            average.assign(decay * average + (1.0 - decay) * tf.cast(live, average.dtype))

    def ema_update(self, decay: float) -> None:
        self._ema_update(tf.constant(decay, tf.float32))

    @contextmanager
    def ema_weights(self):
        live = self.ema_sources()
        assert self.ema is not None  # build() made it (training.ema_decay)
        kept = [v.numpy() for v in live]
        for v, average in zip(live, self.ema):
            v.assign(average)
        try:
            yield
        finally:
            for v, value in zip(live, kept):
                v.assign(value)

    def float64_tensor(self, values: list[float]) -> tf.Tensor:
        return tf.constant(values, tf.float64)

    def seed(self, seed: int) -> None:
        keras.utils.set_random_seed(seed)  # Keras 3 initialisers draw from Python's `random`

    def sync_buffers(self) -> None:
        buffers = tf_variables(self.model.non_trainable_variables)
        if self.ema is not None:  # the EMA of the buffers: linear, so averaged the same way
            fixed = {v.path for v in self.model.non_trainable_variables}
            buffers += [e for e, v in zip(self.ema, self.ema_sources()) if v.path in fixed]
        if hvd.size() > 1 and buffers:
            averaged = hvd.grouped_allreduce(buffers, op=hvd.Average, name="bn_buffers")
            for buffer, value in zip(buffers, averaged):
                buffer.assign(value)

    def ema_entries(self) -> list:
        """parallel.tensor: the EMA copy's checkpoint entries, each cut as the variable it averages."""
        assert self.ema is not None
        return [(f"ema/{i}", live.path, average) for i, (average, live) in enumerate(zip(self.ema, self.ema_sources()))]

    def prepare_ema_checkpoint(self) -> None:
        if self.tensor and self.ema is not None and self.tensor.layout.replica(hvd.rank()) == 0:
            whole = self.tensor.gather(self.ema_entries())  # Horovod: over the group
            self.ema_whole = whole if hvd.rank() == 0 else None

    def save(self, directory: Path) -> None:
        # Each variable's host copy is made as it is written (fileio.savez_one_at_a_time), not
        # all at once: ViT-H/14's 2.5 GB of them killed a zero=2 run under a 22 GB cap.
        arrays: dict[str, np.ndarray | Callable[[], np.ndarray]] = {
            f"model/{i}": v.numpy for i, v in enumerate(self.model.variables)}
        self.strategy.save_state(arrays)  # the optimizer's (ZeRO: gathered, or in shard files), PowerSGD's
        arrays.update({f"ema/{i}": v.numpy for i, v in enumerate(self.ema or [])})
        arrays.update(self.ema_whole or {})  # parallel.tensor: gathered whole
        with fileio.large_output(directory / CHECKPOINT_FILE) as handle:
            fileio.savez_one_at_a_time(handle, arrays)
        self.ema_whole = None

    def load(self, directory: Path) -> None:
        path = directory / CHECKPOINT_FILE
        try:
            with np.load(path) as arrays:
                stored = {key: arrays[key] for key in arrays.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise UserError(f"cannot load {path}: {err or type(err).__name__}") from None
        check_count(path, stored, "model", len(self.model.variables))
        if self.tensor and self.ema is not None:  # whole, before the strategy cuts the model's (dealt on broadcast)
            self.ema_whole = self.whole_ema(stored)
        self.strategy.load_state(stored, directory)  # checked before the model is: nothing half-loaded
        for i, variable in enumerate(self.model.variables):
            if f"model/{i}" in stored:  # (zero=3 took out its sharded variables': read on broadcast)
                variable.assign(stored[f"model/{i}"])
        if self.ema is not None:  # a checkpoint without one: the EMA starts from its weights
            for i, (average, live) in enumerate(zip(self.ema, self.ema_sources())):
                if self.tensor and self.ema_whole is not None:  # parallel.tensor: this rank's slices
                    average.assign(self.tensor.cut(live.path, self.ema_whole[f"ema/{i}"]))
                else:
                    average.assign(stored.get(f"ema/{i}", live.numpy()))

    def whole_ema(self, stored: dict) -> dict[str, np.ndarray]:
        """A whole checkpoint's EMA arrays, or its weights' where it has none."""
        index = {v.path: i for i, v in enumerate(self.model.variables)}
        return {f"ema/{i}": stored.get(f"ema/{i}", stored[f"model/{index[v.path]}"])
                for i, v in enumerate(self.ema_sources())}

    def snapshot(self) -> dict:
        # copies: a numpy view of a variable's buffer would follow the next steps' updates
        return {"model": [np.array(v.numpy(), copy=True) for v in self.model.variables],
                **self.strategy.snapshot()}  # the optimizer's, the counter, PowerSGD's own

    def restore(self, snapshot: dict) -> None:
        for variable, value in zip(self.model.variables, snapshot["model"]):
            if value.shape == tuple(variable.shape):  # (zero=3's storage-less ones: the strategy's slices)
                variable.assign(value)
        self.strategy.restore(snapshot)

    def broadcast_state(self) -> None:
        if self.tensor:  # replica 0's, each rank's from the one holding its slices
            self.tensor.broadcast(self.model.variables)
        else:
            hvd.broadcast_variables(tf_variables(self.model.variables), root_rank=0)  # Horovod
        self.strategy.broadcast_state()  # Horovod: the optimizer's state (ZeRO: each rank its slices)
        if self.ema is not None and self.tensor:  # each rank its slices of rank 0's whole EMA, or replica 0's
            self.tensor.spread(self.ema_entries(), self.ema_whole)
            self.ema_whole = None
        elif self.ema is not None:
            hvd.broadcast_variables(self.ema, root_rank=0)  # Horovod: rank 0's EMA copy

    def weights(self) -> LazyArrays:
        # the strategy's: zero=3 gathers the sharded variables (every rank calls this)
        state = self.strategy.full_state(self.model)  # zero=3: each block gathered as it is read
        return LazyArrays({path: partial(lambda n: host_copy(state[n]), path) for path in state})

    def memory(self) -> dict[str, int]:
        # The gradients as the strategy holds them; the optimizer's per-variable slots (momentum,
        # Adam's moments), not its 0-d iteration count, learning rate or loss scale.
        return {"param_bytes": self.strategy.held_params(), "grad_bytes": self.strategy.held_grads(),
                "optimizer_state_bytes": variable_bytes(v for v in self.optimizer.variables if len(v.shape)),
                **self.strategy.memory_extra()}

    def saved_activation_bytes(self, step) -> Optional[int]:
        graph = self.step_graph(step)
        return None if graph is None else saved_bytes(graph)

    def step_graph(self, step) -> Optional[tf.Graph]:
        """The graph `step()` ran: the traced train step for the arguments it was given (None
        if it did not run one)."""
        traced, calls = self._train_one, []

        def recorded(*args):
            calls.append(args)
            return traced(*args)

        self._train_one = recorded
        try:
            step()
        finally:
            self._train_one = traced
        return traced.get_concrete_function(*calls[-1]).graph if calls else None

    def elastic_state(self, progress: dict):
        variables = tf_variables(self.model.variables) + tf_variables(self.optimizer.variables)
        return elastic.make_state(variables, progress)

    def collective_failures(self) -> ContextManager[None]:
        return elastic.collective_failures()  # Horovod: failed collectives come as OpErrors

    @contextmanager
    def profiler(self, directory: Path):
        tf.profiler.experimental.start(str(directory))  # writes plugins/profile/<run>/*.xplane.pb
        try:
            yield
        finally:
            tf.profiler.experimental.stop()


def create() -> TensorFlowBackend:
    return TensorFlowBackend()
