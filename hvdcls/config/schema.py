"""The configuration schema: one dataclass per section, checked by OmegaConf on every merge
(types, and the choices of Literal-typed keys). Loading is in hvdcls.config, the checks that
need more than a type in hvdcls.config.checks."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Literal, Optional, Union

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ModelConfig", "AugmentConfig", "SyntheticConfig",
           "DataConfig", "LRFindConfig", "OptimizerConfig", "AUTO_LR", "DEFAULT_LR", "REFERENCE_BATCH", "peak_lr",
           "lr_scale", "numeric_lr", "worker_lr", "ScheduleConfig",
           "BalancingConfig", "TrainingConfig", "PowerSGDConfig", "Compression", "Wait", "HorovodConfig",
           "OutputConfig", "ParallelConfig", "Config", "SECTIONS"]

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclass
class ModelConfig:
    # compact_cnn, a ViT of hvdcls.models.VIT (vit_ti_16 ... vit_bigg_14), a torchvision or
    # keras.applications name, or timm/NAME
    name: str = "compact_cnn"
    num_classes: Optional[int] = None  # None: the number of classes the data has
    # The ViTs' patch (hvdcls.models.VIT); None: the architecture's own (16 for B and L, else 14).
    # data.image_size must be a multiple of it: e.g. 32 px in patches of 8 for a CPU run.
    patch_size: Optional[int] = None
    # Initial weights (hvdcls.pretrained, docs/models.md): none (random); the framework's own
    # pretrained names (torchvision's DEFAULT, IMAGENET1K_V2, ...; keras.applications' imagenet),
    # from its cache; a file (.pth, .pt, .safetensors; .weights.h5, .keras); an hvdcls run
    # directory or checkpoint of the same backend. A head of another class count is replaced;
    # the weights' preprocessing (data.mean, data.std) comes with them unless set.
    weights: str = "none"


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
    # loader workers per rank (0: read in the training process), or auto: from the measured
    # load and step times after the first epoch (hvdcls.data.workers)
    workers: Union[int, str] = 2
    # Where JPEGs are decoded: cpu (the loader workers), gpu (the training device, torch with
    # training.device=cuda: hvdcls.data.device_decode), auto (gpu where torch trains on CUDA and
    # torchvision decodes there, else cpu)
    decode: Literal["auto", "cpu", "gpu"] = "auto"
    mean: List[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: List[float] = field(default_factory=lambda: list(IMAGENET_STD))
    # An image file that cannot be decoded: fail (exit 2 naming it) or skip (warn once, count it
    # in summary.json). fail by default: a broken file usually means a broken copy of the data
    # set, and a run that silently trains on less is not the run that was asked for.
    bad_files: Literal["fail", "skip"] = "fail"
    # Which samples an epoch holds: shuffle (each once, shuffled), or balanced (as many draws,
    # with replacement, each class equally likely: for imbalanced classes). Sharded alike:
    # every rank runs the same number of steps.
    sampler: Literal["shuffle", "balanced"] = "shuffle"
    # Batch mixing (hvdcls.data.mixing), on by alpha > 0: each batch is mixed with itself
    # rolled by one; with both on, cutmix is picked with probability mix_switch_prob.
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_switch_prob: float = 0.5
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


AUTO_WORKERS = "auto"  # data.workers=auto
AUTO_LR = "auto"  # optimizer.lr=auto: the learning-rate range test picks the rate
DEFAULT_LR = 0.1  # per 256 images: Goyal et al.'s rule, the schema's default


@dataclass
class LRFindConfig:
    """optimizer.lr=auto and `hvdcls lr-find`: the range test's sweep (hvdcls.training.lr_find).
    The rates are the ones the steps run at (no scale_lr applied): the sweep measures them."""

    steps: int = 100  # at most; it stops once the loss diverges
    min_lr: float = 1e-5
    max_lr: float = 10.0


@dataclass
class OptimizerConfig:
    # lars, lamb: layer-wise trust ratios for large global batches (hvdcls.maths.lars_lamb)
    name: Literal["sgd", "adam", "adamw", "lars", "lamb"] = "sgd"
    # per 256 images of the global batch (see scale_lr); auto: the range test picks it (the
    # default for a user's data, hvdcls.config.USER_DATA_DEFAULTS). An int or a number in a
    # string is a number too (hvdcls.config.checks.lr_setting).
    lr: Union[float, int, str] = DEFAULT_LR
    # per256: lr x global batch / 256 (the linear-scaling rule of Goyal et al.: 0.1 per 256);
    # sqrt: lr x sqrt(global batch / 256) (the square-root rule of Krizhevsky 2014 and Hoffer et
    # al. 2017, gentler at large batches); linear: lr is for one worker's batch, x world size x
    # backward passes; none: as given.
    scale_lr: Literal["per256", "sqrt", "linear", "none"] = "per256"
    momentum: float = 0.9  # sgd, lars
    nesterov: bool = False  # sgd, lars
    weight_decay: float = 1e-4  # lars, lamb: not on biases and normalisation weights
    trust_coefficient: float = 0.001  # lars: eta, the trust ratio's scale (You et al. 2017)
    # Layer-wise learning-rate decay for fine-tuning (BEiT's, timm's; hvdcls.finetune): the head
    # trains at the scheduled rate, each block below it at `layer_decay` times the one above
    # (e.g. 0.65; a ViT's encoder blocks, a ResNet's stages); None or 1.0: one rate for all.
    layer_decay: Optional[float] = None
    lr_find: LRFindConfig = field(default_factory=LRFindConfig)


REFERENCE_BATCH = 256  # optimizer.scale_lr=per256|sqrt: lr is for this many images (Goyal et al.)


def peak_lr(optimizer: OptimizerConfig, world_size: int, backward_passes: int, batch_size: int) -> float:
    """optimizer.lr after optimizer.scale_lr, for `world_size` workers each running
    `backward_passes` batches of `batch_size` per step: the schedule's peak
    (hvdcls.training.schedule)."""
    return numeric_lr(optimizer) * lr_scale(optimizer, world_size, backward_passes, batch_size)


def lr_scale(optimizer: OptimizerConfig, world_size: int, backward_passes: int, batch_size: int) -> float:
    """What optimizer.scale_lr multiplies optimizer.lr by to make the step's rate."""
    if optimizer.scale_lr in ("per256", "sqrt"):
        ratio = batch_size * world_size * backward_passes / REFERENCE_BATCH
        return math.sqrt(ratio) if optimizer.scale_lr == "sqrt" else ratio
    if optimizer.scale_lr == "linear":
        return float(world_size * backward_passes)
    return 1.0


def numeric_lr(optimizer: OptimizerConfig) -> float:
    """optimizer.lr as a number: `auto` must have been resolved (hvdcls.training.lr_sweep)."""
    if isinstance(optimizer.lr, str):
        raise ValueError(f"optimizer.lr={optimizer.lr!r} is not resolved to a number yet")
    return float(optimizer.lr)


def worker_lr(optimizer: OptimizerConfig, batch_size: int) -> float:
    """optimizer.lr for one worker's batch (the peak of a world of one, one pass): what the
    backends build their optimizer with. torch's Horovod broadcast_optimizer_state takes one
    zero-gradient step at that rate (weight decay moves the weights and fills the momentum), so
    it stays what the rate meant before per256 (0.05 for the digits' 0.4 per 256, as it was;
    REFERENCE_BATCH being a power of two, lr x (batch / 256) is the float lr x batch / 256 was).
    optimizer.lr=auto, not yet resolved: DEFAULT_LR stands in (the range test sets every one of
    its steps' rates, and training starts from the rate it found)."""
    if optimizer.lr == AUTO_LR:
        return DEFAULT_LR * lr_scale(optimizer, 1, 1, batch_size)
    return peak_lr(optimizer, 1, 1, batch_size)


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
    # Stop after the first epoch whose validation accuracy (reduced over every rank, so every
    # rank decides alike) reaches this; None: train every epoch. `hvdcls bench --to-accuracy`.
    target_accuracy: Optional[float] = None
    batch_size: int = 32  # per worker, per backward pass
    seed: int = 0
    amp: bool = False
    amp_dtype: Literal["auto", "bfloat16", "float16"] = "auto"  # auto: bfloat16 on CPU, float16 on GPU
    grad_clip_norm: Optional[float] = None
    label_smoothing: float = 0.0
    # The loss's class weights: none, or auto: n_samples / (n_classes x count) from the training
    # split's labels, torch's CrossEntropyLoss(weight=...) in both backends (hvdcls.finetune).
    class_weights: Literal["none", "auto"] = "none"
    # Fine-tuning: the first N epochs train the classifier head alone, everything else frozen (no
    # gradient, no optimizer update, no all-reduce; batch norm keeps training mode); then all.
    freeze_epochs: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # torch: batches in NHWC memory (cuDNN's faster tensor-core kernels with AMP); tensorflow
    # accepts it and has nothing to do (Keras convolutions are NHWC already).
    channels_last: bool = False
    # Compile the training step: torch.compile of the model's forward and backward (inductor;
    # on the CPU it needs a C++ compiler), XLA (jit_compile) for TensorFlow's gradient step.
    # The first steps pay for compiling (docs/recipes.md: what it costs and refuses).
    compile: bool = False
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
    # Recompute activations in the backward pass instead of keeping them: per encoder block of
    # the ViTs (both backends), per ResNet stage (torch); other models are refused.
    activation_checkpointing: bool = False
    # Sharded optimizer (ZeRO, docs/training.md): 0 off; 1 each rank keeps and steps 1/N of the
    # optimizer state; 2 the gradients reduce-scattered too, each rank keeping 1/N of them.
    zero: int = 0
    balancing: BalancingConfig = field(default_factory=BalancingConfig)


@dataclass
class PowerSGDConfig:
    """horovod.compression=powersgd: gradients as rank-r factors (hvdcls/maths/powersgd.py)."""

    rank: int = 4
    start_iter: int = 10  # plain all-reduce for this many first steps (the errors are large)
    min_compression_rate: float = 2.0  # compress a tensor when n*m / (r*(n+m)) reaches this
    fp16: bool = False  # all-reduce P and Q in float16 too


Compression = Literal["none", "fp16", "powersgd"]  # the bench's --compression too
Wait = Literal["auto", "sleep", "spin"]  # the bench's --wait too


@dataclass
class HorovodConfig:
    compression: Compression = "none"
    op: Literal["average", "adasum"] = "average"
    backward_passes_per_step: int = 1  # gradient accumulation: all-reduce every N passes
    # Tensor fusion buffer and the background thread's cycle. A value here beats the environment
    # (`horovodrun --fusion-threshold-mb/--cycle-time-ms` set HOROVOD_FUSION_THRESHOLD and
    # HOROVOD_CYCLE_TIME there); None: the environment's value, else ours: 32 MB and 5 ms (from
    # the bench; hvdcls.launching.horovod_env.SETTINGS), or Horovod's own (tuned) under autotune.
    fusion_threshold_mb: Optional[float] = None
    cycle_time_ms: Optional[float] = None
    hierarchical_allreduce: bool = False
    autotune: bool = False
    autotune_log: Optional[str] = None
    timeline: Optional[str] = None
    sync_bn: bool = False
    # How a torch rank waits for its all-reduces after backward: sleep (poll the handles, a
    # nap of a millisecond between polls), spin (Horovod's synchronize(), a yield loop that
    # takes the core from the threads finishing the all-reduce), or auto: sleep where the
    # gradients are over 16 MB, else spin (parallel.tensor's activation sums sleep under auto,
    # with a 0.1 ms nap). TensorFlow's ops block in TensorFlow's executor either way.
    # docs/horovod-settings.md has the measurements.
    wait: Wait = "auto"
    # Horovod's stall inspector: a collective that some ranks submitted and others did not for
    # this long is reported, naming the missing ranks (0: no check) ...
    stall_check_seconds: int = 60
    # ... and after this long every rank stops, non-zero, instead of hanging (0: never).
    stall_shutdown_seconds: int = 600
    # Horovod's response cache (HOROVOD_CACHE_CAPACITY): None: the environment's, else off in an
    # elastic run (a lost host could abort a survivor with it: docs/horovod-settings.md) and
    # Horovod's own (on, 1024 entries) otherwise; True/False: on (1024) or off whatever the run.
    response_cache: Optional[bool] = None
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
    # MLflow tracking on rank 0 (hvdcls.observe.tracking, docs/tracking.md): a tracking URI
    # (http://host:5000, file:..., sqlite:...); None: off. Needs hvdcls[track].
    mlflow_uri: Optional[str] = None
    mlflow_experiment: str = "hvdcls"  # created on first use
    mlflow_parent_run: Optional[str] = None  # a run id: this run is its child (hvdcls sweep's trials)


@dataclass
class ParallelConfig:
    """How the model itself is split beside the batch (docs/parallelism.md)."""

    # Tensor (feature-map) parallelism, Megatron-LM's split of the ViTs' encoder blocks: T
    # consecutive ranks share each block's heads and MLP units and read the same batches; the
    # np / T replicas average their gradients as data parallelism does. 1: off. Both backends.
    tensor: int = 1


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


SECTIONS = ("model", "data", "optimizer", "schedule", "training", "horovod", "output", "parallel")
