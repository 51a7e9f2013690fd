"""The one configuration schema: dataclasses checked by OmegaConf, YAML files, dotted overrides.

    hvdcls train --config configs/resnet50.yaml data.path=/data/imagenet optimizer.lr=0.2

Precedence, lowest first: the defaults below, the YAML file, `key=value` overrides, then the
torchvision-style flags (`--epochs`, `--lr`, ...). The result is validated once, here; every
problem is reported as one line naming the key (a UserError, exit status 2).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Literal, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from hvdcls.errors import UserError

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclass
class ModelConfig:
    name: str = "compact_cnn"  # compact_cnn, a torchvision name, or a keras.applications name
    num_classes: Optional[int] = None  # None: the number of classes the data has


@dataclass
class AugmentConfig:
    # imagenet: random-resized crop (scale, ratio below) and flips; small: mild zoom and
    # pad-and-crop, no flips (low-resolution images, letters and digits); none: resize only;
    # auto: small below AUTO_SMALL_BELOW px of native size (sampled when the data opens), else
    # imagenet (hvdcls.data.presets).
    preset: Literal["auto", "imagenet", "small", "none"] = "auto"
    random_resized_crop: bool = True  # imagenet preset: false resizes the whole image
    scale: List[float] = field(default_factory=lambda: [0.08, 1.0])
    ratio: List[float] = field(default_factory=lambda: [0.75, 4 / 3])
    hflip: Optional[float] = None  # probability; None: the preset's (imagenet 0.5, else 0)
    # After the crop and flip, torchvision's policies (hvdcls.data.autoaugment): randaugment
    # (num_ops ops at magnitude of 31 bins), trivialaugment (TrivialAugmentWide), autoaugment
    # (the ImageNet policy).
    policy: Literal["none", "randaugment", "trivialaugment", "autoaugment"] = "none"
    magnitude: int = 9  # randaugment: of 0..30
    num_ops: int = 2  # randaugment
    random_erase: float = 0.0  # probability of erasing one random box (after normalising)


@dataclass
class SyntheticConfig:
    num_samples: int = 1024
    num_classes: int = 10


@dataclass
class DataConfig:
    name: Literal["auto", "digits", "synthetic", "imagefolder", "lmdb"] = "auto"
    path: Optional[str] = None  # auto + no path = digits, the embedded default
    image_size: int = 224
    val_fraction: float = 0.1  # held out of train/ when there is no val/
    eval_crop: float = 0.875  # resize to image_size / eval_crop, then centre-crop
    workers: int = 2
    mean: List[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: List[float] = field(default_factory=lambda: list(IMAGENET_STD))
    # An image file that cannot be decoded: fail (exit 2 naming it) or skip (warn once, count it
    # in summary.json). fail by default: a broken file usually means a broken copy of the data
    # set, and a run that silently trains on less is not the run that was asked for.
    bad_files: Literal["fail", "skip"] = "fail"
    # Batch mixing (hvdcls.data.mixing), on by alpha > 0: each batch is mixed with itself
    # rolled by one; with both on, cutmix is picked with probability mix_switch_prob.
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_switch_prob: float = 0.5
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class OptimizerConfig:
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = 0.1  # per 256 images of the global batch; see scale_lr
    # per256: lr x global batch / 256 (the linear-scaling rule of Goyal et al.: 0.1 per 256);
    # linear: lr is for one worker's batch, x world size x backward passes; none: as given.
    scale_lr: Literal["per256", "linear", "none"] = "per256"
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4


REFERENCE_BATCH = 256  # optimizer.scale_lr=per256: lr is for this many images (Goyal et al.)


def worker_lr(optimizer: OptimizerConfig, batch_size: int) -> float:
    """optimizer.lr for one worker's batch: what the backends build their optimizer with.
    torch's Horovod broadcast_optimizer_state takes one zero-gradient step at that rate (weight
    decay moves the weights and fills the momentum), so it stays what the rate meant before
    per256 (0.05 for the digits' 0.4 per 256, as it was)."""
    return optimizer.lr * batch_size / REFERENCE_BATCH if optimizer.scale_lr == "per256" else optimizer.lr


@dataclass
class ScheduleConfig:
    name: Literal["cosine", "step", "multistep", "constant"] = "cosine"
    warmup_epochs: Optional[float] = None  # None: one epoch, or a tenth of a shorter run
    warmup_start_factor: float = 0.1  # warmup starts at this fraction of the peak lr
    min_lr_factor: float = 0.0  # cosine ends at this fraction of the peak lr
    step_size: int = 30  # step: decay every step_size epochs
    milestones: List[int] = field(default_factory=list)  # multistep: decay at these epochs
    gamma: float = 0.1


@dataclass
class BalancingConfig:
    """training.balance != off: per-rank batches sized by speed (hvdcls/training/balance.py).
    Batches are per rank and per backward pass; their sum stays training.batch_size x ranks."""

    shares: List[float] = field(default_factory=list)  # balance=fixed: one relative share per rank
    min_batch: int = 1  # no rank's batch below this
    max_batch: Optional[int] = None  # no rank's batch above this (memory); None: no bound
    quantum: Optional[int] = None  # batches in multiples of this; None: 8 on a GPU, 1 on CPU
    threshold: float = 0.05  # dynamic: re-plan when the predicted step time drops by more
    smoothing: float = 0.5  # dynamic: weight of the newest speed in the moving average
    every: int = 5  # dynamic: steps between speed exchanges (one small allgather each)


@dataclass
class TrainingConfig:
    epochs: int = 10
    batch_size: int = 32  # per worker, per backward pass
    seed: int = 0
    amp: bool = False
    amp_dtype: Literal["auto", "bfloat16", "float16"] = "auto"  # auto: bfloat16 on CPU, float16 on GPU
    grad_clip_norm: Optional[float] = None
    label_smoothing: float = 0.0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # torch: batches in NHWC memory (cuDNN's faster tensor-core kernels with AMP); tensorflow
    # accepts it and has nothing to do (Keras convolutions are NHWC already).
    channels_last: bool = False
    threads: Optional[int] = None  # compute threads per process; None: cores / local ranks
    resume: Optional[str] = None  # checkpoint directory, or a run directory (its latest)
    eval_only: bool = False  # evaluate the resumed checkpoint on the validation split, then stop
    log_every: int = 50  # steps between progress lines (when progress is plain lines)
    profile_steps: int = 0  # profile this many steps of the first epoch (torch/TF profiler); 0: off
    elastic: bool = False  # Horovod elastic mode (horovodrun --min-np/--max-np/--host-discovery-script)
    commit_every: int = 20  # elastic: commit training state every N steps (and at each epoch end)
    # Every rank's watchdog (hvdcls.training.watchdog): a rank that spends this long in one
    # phase (reading data, computing, waiting in the all-reduce, ...) without a step ends its
    # process with exit status 75, naming itself and the phase. The start, each epoch's end
    # and first step, and checkpoint writes get 3x this; 0: no watchdog (and no heartbeats).
    stall_timeout_seconds: float = 600.0
    # Model EMA (hvdcls.training.ema): an averaged copy of the weights, evaluated beside them.
    # None: off; else torchvision's --model-ema-decay (e.g. 0.99998), scaled as it scales it.
    ema_decay: Optional[float] = None
    ema_steps: int = 32  # optimizer steps between EMA updates
    # Per-rank batch sizes: off = equal; fixed = balancing.shares; dynamic = by measured speed.
    balance: Literal["off", "dynamic", "fixed"] = "off"
    balancing: BalancingConfig = field(default_factory=BalancingConfig)


@dataclass
class PowerSGDConfig:
    """horovod.compression=powersgd: gradients as rank-r factors (hvdcls/powersgd.py)."""

    rank: int = 4
    start_iter: int = 10  # plain all-reduce for this many first steps (the errors are large)
    min_compression_rate: float = 2.0  # compress a tensor when n*m / (r*(n+m)) reaches this
    fp16: bool = False  # all-reduce P and Q in float16 too


Compression = Literal["none", "fp16", "powersgd"]  # the bench's --compression too


@dataclass
class HorovodConfig:
    compression: Compression = "none"
    op: Literal["average", "adasum"] = "average"
    backward_passes_per_step: int = 1  # gradient accumulation: all-reduce every N passes
    # Tensor fusion buffer and the background thread's cycle. A value here beats the environment
    # (`horovodrun --fusion-threshold-mb/--cycle-time-ms` set HOROVOD_FUSION_THRESHOLD and
    # HOROVOD_CYCLE_TIME there); None: the environment's value, else ours: 32 MB and 5 ms (from
    # the bench; hvdcls.horovod_env.SETTINGS), or Horovod's own (tuned) under autotune.
    fusion_threshold_mb: Optional[float] = None
    cycle_time_ms: Optional[float] = None
    hierarchical_allreduce: bool = False
    autotune: bool = False
    autotune_log: Optional[str] = None
    timeline: Optional[str] = None
    sync_bn: bool = False
    # Horovod's stall inspector: a collective that some ranks submitted and others did not for
    # this long is reported, naming the missing ranks (0: no check) ...
    stall_check_seconds: int = 60
    # ... and after this long every rank stops, non-zero, instead of hanging (0: never).
    stall_shutdown_seconds: int = 600
    powersgd: PowerSGDConfig = field(default_factory=PowerSGDConfig)


@dataclass
class OutputConfig:
    dir: Optional[str] = None  # None: runs/<timestamp>-<backend>
    checkpoint_every: int = 1  # epochs; 0 disables checkpoints (the last epoch is always saved)
    keep_checkpoints: int = 2
    progress: Literal["auto", "bar", "lines", "quiet"] = "auto"  # auto: a bar on a terminal, else lines
    metrics_port: Optional[int] = None  # Prometheus /metrics on rank 0; 0: any free port; None: off
    metrics_host: str = "0.0.0.0"  # the address /metrics listens on
    metrics_linger_seconds: float = 0.0  # after training, serve until one more scrape or this long
    tensorboard: bool = True  # scalars under RUN_DIR/tensorboard/
    report: bool = True  # RUN_DIR/report.png, redrawn after every epoch


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


SECTIONS = ("model", "data", "optimizer", "schedule", "training", "horovod", "output")


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
            "training.ema_steps",
            "horovod.backward_passes_per_step", "output.keep_checkpoints", "schedule.step_size",
            "horovod.powersgd.rank", "training.balancing.min_batch", "training.balancing.every")
NON_NEGATIVE = ("data.workers", "optimizer.lr", "optimizer.momentum", "optimizer.weight_decay",
                "schedule.min_lr_factor", "data.mixup_alpha", "data.cutmix_alpha", "output.checkpoint_every",
                "training.label_smoothing", "training.seed", "training.profile_steps",
                "training.stall_timeout_seconds",
                "output.metrics_linger_seconds", "horovod.stall_check_seconds",
                "horovod.stall_shutdown_seconds", "horovod.powersgd.start_iter")
OPTIONAL_NON_NEGATIVE = ("schedule.warmup_epochs",)
OPTIONAL_POSITIVE = ("model.num_classes", "training.grad_clip_norm", "training.threads",
                     "horovod.fusion_threshold_mb", "horovod.cycle_time_ms",
                     "training.balancing.max_batch", "training.balancing.quantum")


def _one_line(err: OmegaConfBaseException, source: str) -> UserError:
    key = getattr(err, "full_key", None) or "?"
    value = getattr(err, "value", None)
    if key in CHOICES and isinstance(err, ValidationError) and not OmegaConf.is_config(value):
        return _not_a_choice(key, value if value is None else str(value))
    message = str(getattr(err, "msg", None) or err).splitlines()[0]
    return UserError(f"config {source}: {key}: {message}")


def _parse_overrides(overrides: list[str]) -> list[str]:
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"override {item!r} is not key=value (e.g. optimizer.lr=0.05)")
    return overrides


# The embedded digits are 8x8 grey strokes, not photographs: when the data is digits, these
# replace the ImageNet-style defaults (under the config file, overrides and flags, which still
# win), so a bare `hvdcls train` trains something sensible in seconds.
DIGITS_DEFAULTS = {
    "data": {"image_size": 16, "eval_crop": 1.0, "workers": 0, "mean": [0.5] * 3, "std": [0.5] * 3,
             "augment": {"preset": "imagenet", "scale": [0.7, 1.0], "ratio": [0.8, 1.25], "hflip": 0.0}},
    "optimizer": {"lr": 0.4, "weight_decay": 5e-4},  # 0.05 per worker of 32, as before
    "schedule": {"warmup_epochs": 1.0},
    "training": {"epochs": 12, "log_every": 1000},
}


def load(config_file: Optional[Path] = None, overrides: list[str] = (),
         flags: Optional[dict[str, Any]] = None, settings: Optional[dict] = None) -> Config:
    """Defaults (+ DIGITS_DEFAULTS for digits) <- YAML file <- `settings` (a mapping shaped
    like the file: `hvdcls serve`'s job specs) <- `key=value` overrides <- flags; then
    validate()."""
    layers = []
    if config_file is not None:
        layers.append((f"file {config_file}", _read_yaml(Path(config_file))))
    if settings:
        layers.append(("settings", _guard(lambda: OmegaConf.create(settings), "settings")))
    if overrides:
        layers.append(("override", _guard(lambda: _from_dotlist(_parse_overrides(list(overrides))),
                                          "override")))
    if flags:
        layers.append(("flag", _guard(lambda: OmegaConf.create(_nest(flags)), "flag")))
    merged = _merge(OmegaConf.structured(Config), layers)
    if _is_digits(merged.data):
        merged = _merge(OmegaConf.structured(Config), [("digits defaults", OmegaConf.create(DIGITS_DEFAULTS)), *layers])
    try:
        config: Config = OmegaConf.to_object(merged)  # resolves ${...} interpolations
    except OmegaConfBaseException as err:
        raise _one_line(err, "value") from None
    validate(config)
    return config


def _from_dotlist(overrides: list[str]):
    """OmegaConf.from_dotlist, with a value YAML cannot parse (`key='`) named by its key."""
    import yaml  # OmegaConf's own YAML parser: already imported with it

    for item in overrides:
        try:
            OmegaConf.from_dotlist([item])
        except yaml.YAMLError as err:
            key, _, value = item.partition("=")
            raise UserError(f"config override {key.strip()}: value {value!r} is not valid YAML "
                            f"({str(err).splitlines()[0]})") from None
    return OmegaConf.from_dotlist(overrides)


def _guard(make, source: str):
    try:
        return make()
    except OmegaConfBaseException as err:
        raise _one_line(err, source) from None


def _merge(base, layers):
    for source, layer in layers:
        try:
            _check_sections(layer, source)
            _off_is_a_word(layer)
            base = OmegaConf.merge(base, layer)
        except OmegaConfBaseException as err:
            raise _one_line(err, source) from None
    return base


def _off_is_a_word(layer) -> None:
    """YAML reads a bare `off` as false: where `off` is one of a key's choices, it meant `off`."""
    for key, allowed in CHOICES.items():
        if "off" in allowed and OmegaConf.select(layer, key, default=None) is False:
            OmegaConf.update(layer, key, "off")


def _is_digits(data) -> bool:
    try:
        return data.name == "digits" or (data.name == "auto" and not data.path)
    except OmegaConfBaseException:  # an unresolvable value: validation names it later
        return False


def _check_sections(layer, source: str) -> None:
    """`training=3` would replace a whole section: name it rather than OmegaConf's '?'."""
    for section in SECTIONS:
        if section in layer and not OmegaConf.is_dict(layer._get_node(section)):
            raise UserError(f"config {source}: {section}: is a section, set its keys "
                            f"(e.g. {section}.<key>=...) or give a mapping")


def _read_yaml(path: Path):
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    try:
        loaded = OmegaConf.load(path)
    except Exception as err:  # YAML syntax errors come from the yaml package
        raise UserError(f"config file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(loaded, type(OmegaConf.create({}))):
        raise UserError(f"config file {path} must hold a mapping of sections (model:, data:, ...)")
    return loaded


def read_file(path: Path) -> dict:
    """A YAML config file as a plain mapping (checked like --config; validated by load)."""
    return OmegaConf.to_container(_read_yaml(Path(path)))


def _nest(flat: dict[str, Any]) -> dict:
    """{'training.epochs': 3} -> {'training': {'epochs': 3}}; None values are dropped."""
    nested: dict = {}
    for dotted, value in flat.items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return nested


def get(config: Config, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def validate(config: Config) -> None:
    """Every check that needs no data and no framework; one line naming the key on failure."""
    for key, allowed in CHOICES.items():  # a Config made in code, not by load()
        if get(config, key) not in allowed:
            raise _not_a_choice(key, get(config, key))
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
    _validate_data(config.data)
    _validate_stall(config.horovod)
    _validate_schedule(config.schedule, config.training.epochs)
    _validate_balancing(config)
    if not 0 <= config.optimizer.momentum < 1:
        raise UserError(f"config optimizer.momentum={config.optimizer.momentum}: must be in [0, 1)")
    if config.optimizer.nesterov and config.optimizer.momentum == 0:
        raise UserError("config optimizer.nesterov=true needs optimizer.momentum > 0")
    if config.training.eval_only and not config.training.resume:
        raise UserError("config training.eval_only=true needs a checkpoint to evaluate: --resume PATH")
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
    if not 0 <= config.training.label_smoothing < 1:
        raise UserError(f"config training.label_smoothing={config.training.label_smoothing}: "
                        "must be in [0, 1)")


def _validate_ema(training: TrainingConfig) -> None:
    decay = training.ema_decay
    if decay is None:
        return
    if not 0 < decay < 1:
        raise UserError(f"config training.ema_decay={decay}: must be in (0, 1) (or null: no EMA)")
    if training.elastic:
        raise UserError("config training.ema_decay with training.elastic=true: the EMA weights are "
                        "not part of the elastic state yet; use one or the other")


def _not_a_choice(key: str, value: Any) -> UserError:
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
    """What needs no world size; hvdcls.training.balance.check does the rest after init."""
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
    if config.training.elastic:
        raise UserError(f"config training.balance={mode} with training.elastic=true is not "
                        "supported yet: use one or the other")


def to_dict(config: Config) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)


def to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
