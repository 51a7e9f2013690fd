"""The PyTorch backend: horovod.torch's DistributedOptimizer around a torch model.

Mirror: tf_backend/backend.py. Lines that exist only for distribution say `# Horovod:`.
What needs only Horovod (init, context, object and metric collectives, elastic_run) is
hvdcls.horovod_backend.HorovodBackend's, given horovod.torch here.
"""
from __future__ import annotations

import copy
import pickle
from contextlib import contextmanager, nullcontext
from functools import partial
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any, Optional

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

from hvdcls import strategy
from hvdcls.backend import TOP_K, EvalSums, LazyArrays, Sums, add
from hvdcls.config import Config, worker_lr
from hvdcls.data import device_decode
from hvdcls.data.batches import EpochBatches, LoaderWait
from hvdcls.data.device_decode import EncodedBatch
from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.horovod_backend import HorovodBackend, waits_asleep
from hvdcls.maths import powersgd
from torch_backend import compiled, data, decode, elastic, finetune, models, optimizers, recompute, tensor_parallel
from torch_backend.activations import saved_bytes
from torch_backend.sync_bn import SyncBatchNorm
from torch_backend.weights import CHECKPOINT_FILE, load_initial_weights


def make_optimizer(params, config: Config) -> torch.optim.Optimizer:
    opt, lr = config.optimizer, worker_lr(config.optimizer, config.training.batch_size)
    if opt.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=opt.momentum, nesterov=opt.nesterov,
                               weight_decay=opt.weight_decay)
    if opt.name == "adam":  # L2 added to the gradient, as torch's Adam does
        return torch.optim.Adam(params, lr=lr, weight_decay=opt.weight_decay)
    if opt.name == "lars":
        return optimizers.LARS(params, lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay,
                               trust_coefficient=opt.trust_coefficient, nesterov=opt.nesterov)
    if opt.name == "lamb":
        return optimizers.LAMB(params, lr=lr, weight_decay=opt.weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=opt.weight_decay)


def host_copy(tensor: torch.Tensor) -> np.ndarray:
    """As float32 on the host: a view of a CPU float32 tensor, not a copy."""
    return tensor.detach().cpu().float().numpy()


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def dominant(labels: torch.Tensor) -> torch.Tensor:
    """Class indices; for mixed targets (mixup/cutmix) the class with the largest share."""
    return labels.argmax(1) if labels.ndim == 2 else labels


def amp_dtype(config: Config, device: torch.device) -> torch.dtype | None:
    if not config.training.amp:
        return None
    name = config.training.amp_dtype
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return getattr(torch, name)


def pick_device(config: Config, local_rank: int) -> torch.device:
    wanted = config.training.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise UserError("training.device=cuda but torch sees no CUDA device")
    if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)  # Horovod: one GPU per process, by local rank
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


class TorchBackend(HorovodBackend):
    name = "torch"
    # backward's hooks submit the gradients; what follows them is waiting for the all-reduce
    marks_allreduce_wait = True
    optimizer: Any  # the strategy's: hvd.DistributedOptimizer, the plain one PowerSGD steps, ZeRO's
    counter: powersgd.ByteCounter
    strategy: Any  # hvdcls.strategy: the reduction mode (torch_backend/strategies/), chosen in build
    ema: Optional[dict[str, torch.Tensor]]
    # parallel.tensor: the EMA copy whole, gathered for rank 0 to save or read by it to deal
    ema_whole: Optional[dict[str, torch.Tensor]] = None
    pixel_norm: tuple[list[float], list[float]]  # data.mean, data.std: the loader's uint8 batches, normalised
    tensor: Optional[tensor_parallel.TensorParallel] = None  # parallel.tensor > 1: this rank's place
    decode_on_device = False  # data.decode resolved (setup): the workers hand over the JPEGs' bytes

    def __init__(self):
        super().__init__(hvd, {"torch": torch.__version__, "torchvision": installed_version("torchvision")})

    def setup(self, config: Config, local_rank: int, threads: int) -> torch.device:
        torch.set_num_threads(threads)
        device = pick_device(config, local_rank)
        self.decode_on_device = device_decode.resolve(config.data.decode, device.type, decode.unsupported())
        return device

    def set_threads(self, threads: int) -> bool:
        torch.set_num_threads(threads)  # torch's pool takes a new size at any time
        return True

    def build(self, config: Config, num_classes: int) -> dict:
        hv = config.horovod
        compiled.refuse_what_breaks(config)  # training.compile: one line, nothing built
        # The uint8 batches' normalisation (to_device): the config's, until a loader says which
        # preprocessing its batches had; a batch read through another backend's loader (the lr
        # sweep's twin in its tests) is normalised alike.
        self.pixel_norm = (list(config.data.mean), list(config.data.std))
        model = models.build_model(config.model.name, num_classes, config.data.image_size,
                                   config.model.patch_size)
        # model.weights, before any wrapping: rank 0 reads them, or in elastic mode (no
        # collective in build) every rank; the broadcast below makes the ranks alike.
        loaded = load_initial_weights(model, config, hvd.rank(),
                                      None if config.training.elastic else self.broadcast_object)
        # parallel.tensor: every rank takes rank 0's whole model, then keeps its slices of the blocks
        model, self.tensor = tensor_parallel.build(model, config)
        if config.training.activation_checkpointing:
            model = recompute.enable(model, config.model.name)
        if hv.sync_bn:
            model = models.convert_sync_batchnorm(model, SyncBatchNorm)  # Horovod: global BN stats
        self.model = model.to(self.device)
        # training.compile: the training step runs the compiled module (same parameters)
        self.step_model = compiled.compile_model(self.model) if config.training.compile else self.model
        # training.channels_last: the batches only. Horovod's collectives need contiguous (NCHW)
        # weights and gradients, and a channels-last input alone makes cuDNN pick NHWC kernels.
        channels_last = config.training.channels_last
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.clip = config.training.grad_clip_norm
        self.dtype = amp_dtype(config, self.device)
        self.smoothing = config.training.label_smoothing
        self.criterion = finetune.criterion(None, self.smoothing, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        chosen = strategy.choose(config, "torch", loss_scaled=self.scaler.is_enabled())  # nothing built if refused
        self.last_allreduce_wait: float | None = None
        trained = [tuple(p.shape) for p in self.model.parameters() if p.requires_grad]
        parameters = models.count_parameters(self.model)  # before a strategy may shard them (zero=3)
        # optimizer.layer_decay: one param group per rate multiplier (hvdcls.finetune)
        groups, self.lr_scales = finetune.parameter_groups(self.model, config.model.name, config.optimizer.layer_decay)
        # horovod.wait: poll and nap (not Horovod's spin) while the all-reduces run
        self.wait_asleep = waits_asleep(hv.wait, powersgd.dense_bytes(trained))
        # the reduction mode: its optimizer, exchange, step and state (every rank reduces every
        # parameter; zero=3 keeps a slice of each and takes the whole ones off the model)
        self.strategy = chosen(self, config, list(self.model.named_parameters()), groups,
                               lambda params: make_optimizer(params, config),
                               **({"replicas": self.tensor} if self.tensor else {}))
        self.optimizer, self.counter = self.strategy.optimizer, self.strategy.counter
        self.ema = None
        # training.freeze_epochs: frozen from the start (the range test sweeps that phase), before
        # the broadcast's first optimizer step, which then steps the head alone
        self.freezer = finetune.Freezer(self.model, self.optimizer)
        self.freezer.set(config.training.freeze_epochs > 0)
        if not config.training.elastic:  # elastic: the state's sync broadcasts instead
            self.broadcast_state()  # Horovod: every rank starts from rank 0's weights
        if config.training.ema_decay is not None:  # after the broadcast and its optimizer step
            # Model EMA: a copy of every floating entry of the state (parameters, BN statistics).
            self.ema = {name: t.detach().clone() for name, t in self.ema_sources().items()}
        return {"parameters": parameters, "framework": "torch", "weights": loaded,
                "channels_last": channels_last, "compile": config.training.compile, "zero": config.training.zero,
                "amp_dtype": str(self.dtype).replace("torch.", "") if self.dtype else None,
                "horovod": {"compression": hv.compression, "op": hv.op, "sync_bn": hv.sync_bn,
                            "wait": "sleep" if self.wait_asleep else "spin",
                            "backward_passes_per_step": hv.backward_passes_per_step}}

    def loader(self, batches: EpochBatches, workers: int):
        # uint8 pixels from the workers, normalised on the device (to_device); with data.decode
        # on the device, the JPEGs' bytes and the core's choices, decoded there (to_device)
        uint8 = isinstance(batches, EpochBatches) and batches.uint8_ok
        if uint8:
            self.pixel_norm = (batches.preprocess.config.mean, batches.preprocess.config.std)
        encoded = uint8 and self.decode_on_device and device_decode.possible(batches)
        return data.loader(batches, workers, pin_memory=self.device.type == "cuda", uint8=uint8, encoded=encoded)

    def loader_worker(self, loader: LoaderWait, batches: EpochBatches) -> Optional[str]:
        return data.waited_worker(loader.iterator) or super().loader_worker(loader, batches)

    def to_device(self, images: torch.Tensor) -> torch.Tensor:
        """Images on the device, normalised there when the loader handed over uint8 pixels,
        NHWC in memory when training.channels_last; JPEGs handed over encoded, decoded there."""
        if isinstance(images, EncodedBatch):
            images = decode.decode(images, self.device)
        if images.dtype == torch.uint8:
            images = data.normalise(images.to(self.device), *self.pixel_norm)
        return images.to(self.device, memory_format=self.memory_format)

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def train_step(self, micro_batches: list, lr: float, weight: float = 1.0) -> Sums:
        self.model.train()
        for group, scale in zip(self.optimizer.param_groups, self.lr_scales):
            group["lr"] = lr * scale
        self.strategy.begin(len(micro_batches))  # gradients cleared (ZeRO: its buckets armed)
        total = None
        for images, labels in micro_batches:
            images, labels = self.to_device(images), labels.to(self.device)
            with self.autocast():
                logits = self.step_model(images)
                loss = self.criterion(logits, labels)  # class indices, or mixed targets (N, C)
            # Accumulated passes each carry 1/N of the step's gradient; `weight` makes this
            # rank's share of the ranks' average its share of the samples (training.balance),
            # before any compression sees the gradient.
            objective = loss / len(micro_batches)
            if weight != 1.0:
                objective = objective * weight
            self.scaler.scale(objective).backward()
            total = add(total, Sums(loss.detach().float() * len(labels),
                                    (logits.argmax(1) == dominant(labels)).sum(), len(labels)))
        self.last_allreduce_wait = self.strategy.step()  # Horovod: the exchange, then the update
        self.scaler.update()
        assert total is not None  # a step has at least one micro-batch
        return total

    def unscale_and_clip(self) -> None:
        """The strategy's step, once the gradients are exchanged: mixed precision's unscale, then
        training.grad_clip_norm over the strategy's gradients (ZeRO's: every rank's slices)."""
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
        if self.clip:
            self.strategy.clip_grad_norm_(self.clip)

    @torch.inference_mode()
    def eval_step(self, batch) -> EvalSums:
        self.model.eval()
        images, labels = self.to_device(batch[0]), batch[1].to(self.device)
        with self.autocast():
            logits = self.model(images)
        loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        classes, predicted = logits.shape[1], logits.argmax(1)
        top5 = (logits.topk(min(TOP_K, classes), 1).indices == labels[:, None]).any(1).sum()
        confusion = torch.bincount(labels * classes + predicted, minlength=classes * classes).cpu()
        return EvalSums(loss, (predicted == labels).sum(), len(labels), top5, confusion)

    def ema_sources(self) -> dict[str, torch.Tensor]:
        """The model's floating state entries by name (views of the live tensors)."""
        return self.floating(self.model.state_dict())

    @staticmethod
    def floating(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: t for name, t in state.items() if t.is_floating_point()}

    @torch.no_grad()
    def ema_update(self, decay: float) -> None:
        assert self.ema is not None  # build() made it (training.ema_decay)
        for name, live in self.ema_sources().items():
            self.ema[name].mul_(decay).add_(live.detach(), alpha=1.0 - decay)

    @contextmanager
    def ema_weights(self):
        live = self.ema_sources()
        kept = {name: t.clone() for name, t in live.items()}
        assert self.ema is not None  # build() made it (training.ema_decay)
        with torch.no_grad():
            for name, t in live.items():
                t.copy_(self.ema[name])
            try:
                yield
            finally:
                for name, t in live.items():
                    t.copy_(kept[name])

    def set_frozen(self, frozen: bool) -> None:
        self.freezer.set(frozen)

    def set_class_weights(self, weights) -> None:
        self.criterion = finetune.criterion(weights, self.smoothing, self.device)

    def float64_tensor(self, values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def sync_buffers(self) -> None:
        named = [(n, b) for n, b in self.model.named_buffers() if b.is_floating_point()]
        buffers = [b for _, b in named]
        if self.ema is not None:  # the EMA of the buffers: linear, so averaged the same way
            buffers += [self.ema[n] for n, _ in named if n in self.ema]
        if hvd.size() > 1 and buffers:
            averaged = hvd.grouped_allreduce(buffers, op=hvd.Average, name="bn_buffers")
            for buffer, value in zip(buffers, averaged):
                buffer.copy_(value)

    def prepare_ema_checkpoint(self) -> None:
        if self.tensor and self.ema is not None and self.tensor.layout.replica(hvd.rank()) == 0:
            whole = self.tensor.gather(self.ema)  # Horovod: over the group
            self.ema_whole = whole if hvd.rank() == 0 else None

    def save(self, directory: Path) -> None:
        state = {"model": self.model.state_dict(), "scaler": self.scaler.state_dict()}
        self.strategy.save_state(state)  # "optimizer", and PowerSGD's own
        if self.ema is not None:
            state["ema"] = self.ema_whole if self.ema_whole is not None else self.ema
        with fileio.large_output(directory / CHECKPOINT_FILE) as handle:
            torch.save(state, handle)
        self.strategy.saved()
        self.ema_whole = None

    def load(self, directory: Path) -> None:
        path = directory / CHECKPOINT_FILE
        try:
            state = torch.load(path, map_location=self.device, weights_only=True)
            if self.tensor:  # parallel.tensor: a whole checkpoint, this rank's slices taken (the rest dealt)
                if self.ema is not None:  # (one without an EMA: it starts from the weights)
                    self.ema_whole = state.get("ema") or self.floating(state["model"])
                state = self.tensor.take_whole(state)
            # the strategy's first: it refuses another mode's layout in one line (zero=3's model
            # holds no parameters, the others' every one), before the model's state is compared
            self.strategy.load_state(state, directory)  # the optimizer's (ZeRO: maybe in the ranks' shard files)
            self.model.load_state_dict(state["model"])
            self.scaler.load_state_dict(state["scaler"])
            if self.ema is not None:  # a checkpoint without one: the EMA starts from its weights
                stored = state.get("ema") or self.ema_sources()
                if self.tensor and "ema" in state:
                    stored = self.tensor.cut(stored)
                for name, t in self.ema.items():
                    t.copy_(stored[name])
        except (OSError, RuntimeError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise UserError(f"cannot load {path}: {reason}") from None

    def snapshot(self) -> dict:
        # deepcopy: state_dict() hands out the live tensors, which the next steps change in place
        state = copy.deepcopy({"model": self.model.state_dict(), "scaler": self.scaler.state_dict()})
        return {**state, **self.strategy.snapshot()}  # the optimizer's, the counter, PowerSGD's own

    def restore(self, snapshot: dict) -> None:
        self.model.load_state_dict(snapshot["model"])  # copied into the live parameters
        self.strategy.restore(snapshot)
        self.scaler.load_state_dict(snapshot["scaler"])

    def broadcast_state(self) -> None:
        self.broadcast_tensors(list(self.model.state_dict().items()))
        self.strategy.broadcast_state()  # Horovod: the optimizer's state (ZeRO: each rank its slices)
        if self.ema is not None and self.tensor:  # each rank its slices of rank 0's whole EMA, or replica 0's
            self.tensor.spread(list(self.ema.items()), self.ema_whole)
            self.ema_whole = None
        elif self.ema is not None:  # Horovod: rank 0's EMA copy
            self.broadcast_tensors([(f"ema.{n}", t) for n, t in self.ema.items()])

    def broadcast_tensors(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Rank 0's; parallel.tensor: replica 0's, each rank's from the one holding its slices."""
        if self.tensor:
            self.tensor.broadcast(named)
        else:
            hvd.broadcast_parameters(named, root_rank=0)  # Horovod

    def weights(self) -> LazyArrays:
        # the strategy's: zero=3 gathers the sharded parameters (every rank calls this)
        state = self.strategy.full_state(self.model)  # zero=3: each block gathered as it is read
        return LazyArrays({name: partial(lambda n: host_copy(state[n]), name) for name in state})

    def memory(self) -> dict[str, int]:
        # Gradients as they are held now: after a step, every trained parameter's (the next
        # step's zero_grad frees them); the state as the optimizer keeps it, per parameter.
        state = [t for per_param in self.optimizer.state.values() for t in per_param.values()
                 if torch.is_tensor(t) and t.ndim > 0]  # not Adam's 0-d step counts
        grads = self.strategy.held_grads()
        return {"param_bytes": tensor_bytes(self.strategy.held_params()), "grad_bytes": tensor_bytes(grads),
                "optimizer_state_bytes": tensor_bytes(state), **self.strategy.memory_extra()}

    def saved_activation_bytes(self, step) -> int:
        return saved_bytes(self.model, step)

    def elastic_state(self, progress: dict):
        return elastic.make_state(self.model, self.optimizer, progress)

    def allreduce_wait_seconds(self) -> float | None:
        # The time around optimizer.synchronize(): backward hooks start each gradient's
        # all-reduce as soon as it exists, so this is only the part backward did not hide.
        return self.last_allreduce_wait

    @contextmanager
    def profiler(self, directory: Path):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profile:
            yield
        profile.export_chrome_trace(str(directory / "torch_trace.json"))
        sort_by = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        (directory / "torch_ops.txt").write_text(profile.key_averages().table(sort_by=sort_by, row_limit=40))


def create() -> TorchBackend:
    return TorchBackend()
