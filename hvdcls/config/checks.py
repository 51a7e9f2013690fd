"""The checks on a whole Config that its types cannot express: ranges, choices of a Config
made in code, and the keys that depend on each other; one line naming the key on failure."""
from __future__ import annotations

import math
import typing
from typing import Any, Literal, Union

from hvdcls.config.schema import (
    AUTO_LR,
    AUTO_WORKERS,
    Config,
    DataConfig,
    HorovodConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainingConfig,
)
from hvdcls.errors import UserError
from hvdcls.finetune import decay_in_force
from hvdcls.maths.tensor_parallel import check_heads
from hvdcls.maths.zero import check_level
from hvdcls.models import VIT, vit_patches, vit_spec


def _choices(cls: type, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """{dotted key: allowed values} of every Literal-typed field under the dataclass `cls`."""
    out: dict[str, tuple[str, ...]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) is Literal:
            out[prefix + name] = typing.get_args(hint)
        elif isinstance(hint, type) and hasattr(hint, "__dataclass_fields__"):
            out.update(_choices(hint, f"{prefix}{name}."))
    return out


# The keys with a fixed set of values, read from the field types (OmegaConf checks them on merge).
CHOICES = _choices(Config)
POSITIVE = ("data.image_size", "data.synthetic.num_samples", "data.synthetic.num_classes",
            "training.epochs", "training.batch_size", "training.log_every", "training.commit_every",
            "training.ema_steps", "optimizer.trust_coefficient", "optimizer.lr_find.steps",
            "horovod.backward_passes_per_step", "output.keep_checkpoints", "schedule.step_size",
            "horovod.powersgd.rank", "training.balancing.min_batch", "training.balancing.every")
NON_NEGATIVE = ("optimizer.momentum", "optimizer.weight_decay",
                "schedule.min_lr_factor", "data.mixup_alpha", "data.cutmix_alpha", "output.checkpoint_every",
                "training.label_smoothing", "training.seed", "training.profile_steps",
                "training.stall_timeout_seconds", "training.freeze_epochs",
                "output.metrics_linger_seconds", "horovod.stall_check_seconds",
                "horovod.stall_shutdown_seconds", "horovod.powersgd.start_iter")
OPTIONAL_NON_NEGATIVE = ("schedule.warmup_epochs",)
OPTIONAL_POSITIVE = ("model.num_classes", "model.patch_size", "training.grad_clip_norm", "training.threads",
                     "horovod.fusion_threshold_mb", "horovod.cycle_time_ms",
                     "training.balancing.max_batch", "training.balancing.quantum")


def get(config: Config, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def validate(config: Config) -> None:
    """Every check that needs no data and no framework; one line naming the key on failure."""
    for key, allowed in CHOICES.items():  # a Config made in code, not by load()
        if get(config, key) not in allowed:
            raise not_a_choice(key, get(config, key))
    for key in POSITIVE:
        _check(key, get(config, key), lambda v: v > 0, "must be > 0")
    for key in NON_NEGATIVE:
        _check(key, get(config, key), lambda v: v >= 0, "must be >= 0")
    for key in OPTIONAL_POSITIVE:
        value = get(config, key)
        if value is not None:
            _check(key, value, lambda v: v > 0, "must be > 0 (or null)")
    for key in OPTIONAL_NON_NEGATIVE:
        value = get(config, key)
        if value is not None:
            _check(key, value, lambda v: v >= 0, "must be >= 0 (or null)")
    _validate_lr(config.optimizer, config.training)
    _validate_data(config.data)
    _validate_decode(config)
    _validate_vit(config)
    _validate_stall(config.horovod)
    _validate_schedule(config.schedule, config.training.epochs)
    _validate_balancing(config)
    if not 0 <= config.optimizer.momentum < 1:
        raise UserError(f"config optimizer.momentum={config.optimizer.momentum}: must be in [0, 1)")
    if config.optimizer.nesterov and config.optimizer.momentum == 0:
        raise UserError("config optimizer.nesterov=true needs optimizer.momentum > 0")
    if config.training.eval_only and not config.training.resume:
        raise UserError("config training.eval_only=true needs a checkpoint to evaluate: --resume PATH")
    if config.training.elastic and config.data.sampler == "balanced":
        raise UserError("config data.sampler=balanced with training.elastic=true: an elastic epoch deals "
                        "each sample once over whatever world there is; use data.sampler=shuffle")
    if config.training.elastic and config.training.eval_only:
        raise UserError("config training.elastic=true with training.eval_only=true: evaluation "
                        "alone has nothing to recover, drop training.elastic")
    port = config.output.metrics_port
    if port is not None and not 0 <= port <= 65535:
        raise UserError(f"config output.metrics_port={port}: a TCP port in [0, 65535] (0: any free port)")
    if config.horovod.powersgd.min_compression_rate < 1:
        raise UserError(f"config horovod.powersgd.min_compression_rate="
                        f"{config.horovod.powersgd.min_compression_rate}: must be >= 1")
    if config.horovod.compression == "powersgd" and config.horovod.op == "adasum":
        raise UserError("config horovod.compression=powersgd averages P and Q: it cannot be combined "
                        "with horovod.op=adasum")
    if config.horovod.compression == "powersgd" and config.training.elastic:
        # A worker that joins after a reset would start from another Q and no error feedback.
        raise UserError("config horovod.compression=powersgd with training.elastic=true: the "
                        "PowerSGD state is not part of the elastic state yet; use one or the other")
    _validate_ema(config.training)
    _validate_zero(config)
    _validate_tensor(config)
    if config.training.activation_checkpointing and config.horovod.sync_bn:
        # The recomputation would run synchronised batch norm's all-reduces a second time,
        # inside the backward pass, beside the gradients' own.
        raise UserError("config training.activation_checkpointing=true with horovod.sync_bn=true: "
                        "the recomputed forward would repeat the batch-norm all-reduces; use one or the other")
    _validate_target(config.training)
    _validate_finetune(config)
    if not 0 <= config.training.label_smoothing < 1:
        raise UserError(f"config training.label_smoothing={config.training.label_smoothing}: "
                        "must be in [0, 1)")


def _validate_vit(config: Config) -> None:
    spec, patch = vit_spec(config.model.name), config.model.patch_size
    if patch is not None and spec is None:
        raise UserError(f"config model.patch_size={patch} is for the ViTs ({', '.join(VIT)}); "
                        f"model.name={config.model.name!r} has no patches")
    if spec is not None:
        vit_patches(config.data.image_size, patch or spec.patch_size)


def _validate_zero(config: Config) -> None:
    """training.zero: the level, and what the sharded step does not serve (docs/training.md)."""
    zero = config.training.zero
    check_level(zero)
    if zero == 0:
        return
    if config.training.elastic:  # a reset changes the world size: every slice moves
        raise UserError(f"config training.zero={zero} with training.elastic=true: the optimizer state "
                        "is sharded by world size and an elastic reset would have to re-shard it; use one "
                        "or the other")
    if config.horovod.compression == "powersgd":
        raise UserError(f"config training.zero={zero} with horovod.compression=powersgd: PowerSGD "
                        "all-reduces whole low-rank factors, not slices; use horovod.compression=fp16 or none")
    if config.horovod.op == "adasum":
        raise UserError(f"config training.zero={zero} with horovod.op=adasum: Adasum combines whole "
                        "updates, the sharded step averages gradients; use horovod.op=average")
    if config.optimizer.name in ("lars", "lamb"):
        raise UserError(f"config training.zero={zero} with optimizer.name={config.optimizer.name}: its "
                        "trust ratio needs each layer's whole norm, a slice has part of it; use sgd, adam "
                        "or adamw")
    if config.training.amp and config.training.amp_dtype == "float16":
        raise UserError(f"config training.zero={zero} with training.amp_dtype=float16: the loss scaler "
                        "does not see the sharded gradients; use training.amp_dtype=bfloat16")
    if zero == 3:
        _validate_zero3(config)


def _validate_zero3(config: Config) -> None:
    """training.zero=3 (the parameters sharded): what its per-block gathers do not serve yet."""
    training = config.training
    if training.ema_decay is not None:
        raise UserError("config training.ema_decay with training.zero=3: the EMA would be a full copy of "
                        "the parameters on every rank, which zero=3 shards; use one or the other")
    if training.compile:
        raise UserError("config training.compile=true with training.zero=3: the per-block gathers are "
                        "collectives in forward hooks, which torch.compile does not trace; use one or the other")
    if config.horovod.compression == "fp16":
        raise UserError("config horovod.compression=fp16 with training.zero=3: the blocks are gathered and "
                        "reduce-scattered in float32; use horovod.compression=none")


def _tensor_conflict(config: Config) -> str | None:
    """What parallel.tensor > 1 does not serve (yet): the key as it is set, else None."""
    training, hv = config.training, config.horovod
    conflicts = [
        (hv.compression == "powersgd", "horovod.compression=powersgd"),
        (hv.op == "adasum", "horovod.op=adasum"),
        (training.elastic, "training.elastic=true"),
        (training.balance == "dynamic", "training.balance=dynamic"),  # fixed: per replica
        (training.zero == 3, "training.zero=3"),  # zero 1 and 2 shard over the replicas
        (training.compile, "training.compile=true"),
    ]
    return next((key for conflict, key in conflicts if conflict), None)


def _validate_tensor(config: Config) -> None:
    """parallel.tensor: a ViT whose heads it divides, and no mode that cannot serve its split
    (the world size is checked once known: hvdcls.maths.tensor_parallel.Layout)."""
    tensor = config.parallel.tensor
    _check("parallel.tensor", tensor, lambda v: v >= 1, "must be >= 1 (1: off)")
    if tensor == 1:
        return
    spec = vit_spec(config.model.name)
    if spec is None:
        raise UserError(f"config parallel.tensor={tensor} splits the ViTs' encoder blocks ({', '.join(VIT)}); "
                        f"model.name={config.model.name!r} has none")
    check_heads(tensor, spec.heads, config.model.name)
    if config.optimizer.name in ("lars", "lamb"):
        raise UserError(f"config parallel.tensor={tensor} with optimizer.name={config.optimizer.name}: its "
                        "trust ratio needs each layer's whole norm, and a rank holds part of a split layer; "
                        "use sgd, adam or adamw")
    conflict = _tensor_conflict(config)
    if conflict:
        raise UserError(f"config parallel.tensor={tensor} with {conflict}: not built for tensor "
                        "parallelism yet; use one or the other")


def _validate_finetune(config: Config) -> None:
    """optimizer.layer_decay, training.freeze_epochs and training.class_weights (hvdcls.finetune):
    the range, and what the sharded and elastic steps and soft targets do not serve."""
    decay, training = config.optimizer.layer_decay, config.training
    if decay is not None and not 0 < decay <= 1:
        raise UserError(f"config optimizer.layer_decay={decay}: must be in (0, 1] (or null: off)")
    if training.zero and (training.freeze_epochs or decay_in_force(decay)):
        key = (f"training.freeze_epochs={training.freeze_epochs}" if training.freeze_epochs
               else f"optimizer.layer_decay={decay}")
        # a flat bucket mixes every layer's parameters: one slice, one rate, no frozen part
        raise UserError(f"config {key} with training.zero={training.zero}: the sharded optimizer steps "
                        "flat buckets of every layer at one rate; use training.zero=0")
    if training.freeze_epochs and training.elastic:
        raise UserError(f"config training.freeze_epochs={training.freeze_epochs} with training.elastic=true: "
                        "the elastic loop does not switch the frozen layers at an epoch boundary yet; "
                        "use one or the other")
    if training.class_weights == "none":
        return
    if config.data.mixup_alpha or config.data.cutmix_alpha:
        raise UserError("config training.class_weights=auto with data.mixup_alpha/cutmix_alpha: a mixed "
                        "target has no single class to weigh; use one or the other")
    if config.data.sampler == "balanced":
        raise UserError("config training.class_weights=auto with data.sampler=balanced: both correct the "
                        "same imbalance, together twice; use one or the other")


def _validate_ema(training: TrainingConfig) -> None:
    decay = training.ema_decay
    if decay is None:
        return
    if not 0 < decay < 1:
        raise UserError(f"config training.ema_decay={decay}: must be in (0, 1) (or null: no EMA)")
    if training.elastic:
        raise UserError("config training.ema_decay with training.elastic=true: the EMA weights are "
                        "not part of the elastic state yet; use one or the other")


def workers_setting(value: Any) -> Union[int, str]:
    """data.workers as the run uses it: an int >= 0 (a number in a string too), or "auto"."""
    if value == AUTO_WORKERS:
        return AUTO_WORKERS
    try:
        number = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or number < 0:
        raise UserError(f"config data.workers={value!r}: a number of loader workers >= 0 "
                        f"(0 reads in the training process) or {AUTO_WORKERS} (from measured times)")
    return number


def lr_setting(value: Any) -> Union[float, str]:
    """optimizer.lr as the run uses it: a float >= 0, or "auto". A number may come as an int
    (`lr: 1`) or a string (a quoted YAML value, a job spec's settings)."""
    if value == AUTO_LR:
        return AUTO_LR
    try:
        number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is not None and not math.isfinite(number):  # worded as the service's spec check
        raise UserError(f"config optimizer.lr: {number} is not a finite number")
    if number is None:
        raise UserError(f"config optimizer.lr={value!r}: a number (per 256 images under "
                        f"optimizer.scale_lr=per256) or {AUTO_LR} (the range test picks it)")
    if number < 0:
        raise UserError(f"config optimizer.lr={number}: must be >= 0")
    return number


def _validate_lr(optimizer: OptimizerConfig, training: TrainingConfig) -> None:
    find = optimizer.lr_find
    if not 0 < find.min_lr < find.max_lr:
        raise UserError(f"config optimizer.lr_find: needs 0 < min_lr < max_lr "
                        f"(min_lr={find.min_lr}, max_lr={find.max_lr})")
    if lr_setting(optimizer.lr) != AUTO_LR:
        return
    if training.eval_only:
        raise UserError("config optimizer.lr=auto with training.eval_only=true: evaluation trains "
                        "nothing, so there is no rate to find; drop optimizer.lr=auto")
    if training.elastic:  # the sweep's collectives would run before the elastic state syncs
        raise UserError("config optimizer.lr=auto with training.elastic=true: the range test runs "
                        "before training, outside the elastic loop; give optimizer.lr a number "
                        "(`hvdcls lr-find` finds one)")


def _validate_target(training: TrainingConfig) -> None:
    target = training.target_accuracy
    if target is None:
        return
    if not 0 < target <= 1:  # NaN too
        raise UserError(f"config training.target_accuracy={target}: a validation accuracy in (0, 1] "
                        "(or null: train every epoch)")
    if training.elastic:
        raise UserError("config training.target_accuracy with training.elastic=true: the elastic "
                        "loop does not stop early yet; use one or the other")


def not_a_choice(key: str, value: Any) -> UserError:
    return UserError(f"config {key}={value!r}: choose one of {', '.join(CHOICES[key])}")


def _check(key: str, value: Any, ok, why: str) -> None:
    if not ok(value):
        raise UserError(f"config {key}={value!r}: {why}")


def _validate_data(data: DataConfig) -> None:
    if data.name in ("digits", "synthetic") and data.path:
        raise UserError(f"config data.path={data.path!r} is set but data.name={data.name!r} "
                        "uses no path: drop one (data.name=auto detects the format of a path)")
    if data.name in ("imagefolder", "lmdb") and not data.path:
        raise UserError(f"config data.name={data.name!r} needs data.path")
    if not 0 < data.val_fraction < 1:
        raise UserError(f"config data.val_fraction={data.val_fraction}: must be in (0, 1)")
    if not 0 < data.eval_crop <= 1:
        raise UserError(f"config data.eval_crop={data.eval_crop}: must be in (0, 1]")
    for key, values in (("data.mean", data.mean), ("data.std", data.std)):
        if len(values) != 3:
            raise UserError(f"config {key}={list(values)}: needs 3 values (R, G, B)")
    if min(data.std) <= 0:
        raise UserError(f"config data.std={list(data.std)}: values must be > 0")
    scale, ratio = data.augment.scale, data.augment.ratio
    if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        raise UserError(f"config data.augment.scale={list(scale)}: needs [low, high] in (0, 1]")
    if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
        raise UserError(f"config data.augment.ratio={list(ratio)}: needs [low, high], 0 < low <= high")
    aug = data.augment
    for key, value in (("augment.hflip", aug.hflip), ("augment.random_erase", aug.random_erase),
                       ("mix_switch_prob", data.mix_switch_prob)):
        if value is not None and not 0 <= value <= 1:
            raise UserError(f"config data.{key}={value}: a probability in [0, 1]")
    if not 0 <= aug.magnitude <= 30:
        raise UserError(f"config data.augment.magnitude={aug.magnitude}: must be in [0, 30]")
    if not 1 <= aug.num_ops <= 14:
        raise UserError(f"config data.augment.num_ops={aug.num_ops}: must be in [1, 14]")


def _validate_decode(config: Config) -> None:
    """data.decode=gpu: what the device path cannot do, refused before any work (the rest, a
    rank without a CUDA device or a backend that cannot, is the backend's setup's to refuse)."""
    data = config.data
    if data.decode != "gpu":
        return
    if config.training.device == "cpu":
        raise UserError("config data.decode=gpu with training.device=cpu: decoding on the GPU needs "
                        "training.device=cuda (or auto with a GPU)")
    aug = data.augment
    on_pixels = [f"{key}={value}" for key, value, used in (
        ("data.augment.preset", aug.preset, aug.preset == "small"),
        ("data.augment.policy", aug.policy, aug.policy != "none"),
        ("data.augment.random_erase", aug.random_erase, aug.random_erase > 0),
        ("data.mixup_alpha", data.mixup_alpha, data.mixup_alpha > 0),
        ("data.cutmix_alpha", data.cutmix_alpha, data.cutmix_alpha > 0)) if used]
    if on_pixels:
        raise UserError(f"config data.decode=gpu with {', '.join(on_pixels)}: that augmentation runs on "
                        "the decoded pixels in the loader workers; use data.decode=auto or cpu")


def _validate_stall(horovod: HorovodConfig) -> None:
    check, shutdown = horovod.stall_check_seconds, horovod.stall_shutdown_seconds
    if shutdown and not check:
        raise UserError(f"config horovod.stall_shutdown_seconds={shutdown} needs the stall check: "
                        "horovod.stall_check_seconds > 0")
    if shutdown and shutdown < check:
        raise UserError(f"config horovod.stall_shutdown_seconds={shutdown}: must be >= "
                        f"horovod.stall_check_seconds={check} (or 0: never)")


def _validate_schedule(schedule: ScheduleConfig, epochs: int) -> None:
    if schedule.warmup_epochs is not None and schedule.warmup_epochs >= epochs and schedule.warmup_epochs > 0:
        raise UserError(f"config schedule.warmup_epochs={schedule.warmup_epochs}: must be shorter "
                        f"than training.epochs={epochs}")
    if not 0 < schedule.warmup_start_factor <= 1:
        raise UserError(f"config schedule.warmup_start_factor={schedule.warmup_start_factor}: "
                        "must be in (0, 1]")
    if not 0 < schedule.gamma <= 1:
        raise UserError(f"config schedule.gamma={schedule.gamma}: must be in (0, 1]")
    if list(schedule.milestones) != sorted(set(schedule.milestones)):
        raise UserError(f"config schedule.milestones={list(schedule.milestones)}: "
                        "must be increasing epochs")


def _validate_balancing(config: Config) -> None:
    """What needs no world size; hvdcls.training.balance.settings does the rest after init."""
    mode, bal = config.training.balance, config.training.balancing
    if mode == "fixed" and not bal.shares:
        raise UserError("config training.balance=fixed needs training.balancing.shares "
                        "(one relative share per rank, e.g. [2, 1])")
    if mode != "fixed" and bal.shares:
        raise UserError(f"config training.balancing.shares is set but training.balance={mode}: "
                        "shares are for balance=fixed")
    if any(share <= 0 for share in bal.shares):
        raise UserError(f"config training.balancing.shares={list(bal.shares)}: shares must be > 0")
    if bal.max_batch is not None and bal.max_batch < bal.min_batch:
        raise UserError(f"config training.balancing.max_batch={bal.max_batch}: must be >= "
                        f"training.balancing.min_batch={bal.min_batch}")
    if not 0 <= bal.threshold < 1:
        raise UserError(f"config training.balancing.threshold={bal.threshold}: must be in [0, 1)")
    if not 0 < bal.smoothing <= 1:
        raise UserError(f"config training.balancing.smoothing={bal.smoothing}: must be in (0, 1]")
    if mode == "off":
        return
    if config.horovod.op == "adasum":  # Adasum does not average: sample weights do not apply
        raise UserError(f"config training.balance={mode} weights gradients by samples, which "
                        "horovod.op=adasum does not average: use horovod.op=average")
    if mode == "fixed" and config.training.elastic:  # one share per rank, of a world that changes
        raise UserError("config training.balance=fixed with training.elastic=true: the shares are "
                        "one per rank and an elastic world changes size; use training.balance=dynamic")
