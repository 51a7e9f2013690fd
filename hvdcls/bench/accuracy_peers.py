"""The plain references beside hvdcls in `hvdcls bench --to-accuracy --runners ...`:

    ddp    torchrun + DistributedDataParallel (benchmarks/ddp_train_torch.py), at each torch
           cell's np and per-worker batch
    keras  one process of Keras `fit` (benchmarks/keras_fit_tf.py), at each TensorFlow cell's
           global batch

Each gets hvdcls's recipe for the cell as flags, resolved from the same key=value settings by
hvdcls's own config (model, augmentation, optimizer, the scaled peak rate, warmup and cosine),
and the same split: the digits as hvdcls splits them for the run's seed, written once to an .npz
(the one-time packing the clock leaves out), or the user's ImageFolder directory, which each
script reads through its own framework's loader (torchvision's ImageFolder, Keras'
image_dataset_from_directory) with data.workers processes per rank. The model is compact_cnn,
written out in each script, or any name its framework builds (torchvision, keras.applications).
What the scripts cannot reproduce is refused in one line before anything runs.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from hvdcls import config as cfg
from hvdcls.bench import peers
from hvdcls.config import Config, peak_lr
from hvdcls.errors import UserError

SCRIPTS = {"ddp": "ddp_train_torch.py", "keras": "keras_fit_tf.py"}
BACKEND = {"ddp": "torch", "keras": "tensorflow"}  # the hvdcls cells each peer stands beside


def resolve(overrides: list[str], epochs: int, batch_size: int, lr: Optional[float],
            seed_offset: int = 0) -> Config:
    """hvdcls's config for a cell's run: what its `hvdcls train` launch resolves to."""
    config = cfg.load(overrides=overrides, flags={"training.epochs": epochs, "training.batch_size": batch_size,
                                                  "optimizer.lr": lr})
    config.training.seed += seed_offset
    return config


def data_format(config: Config) -> str:
    from hvdcls.data import datasets

    return datasets.format_name(config)


def check(config: Config) -> None:
    """What the plain scripts reproduce: the digits or an ImageFolder, compact_cnn or a model
    their framework builds by name, the imagenet-style crop (no policy, erase or mixing), SGD or
    AdamW, cosine or constant after warmup."""
    why = None
    d, aug = config.data, config.data.augment
    if data_format(config) not in ("digits", "imagefolder"):
        why = f"data: the peers read the digits or an ImageFolder directory, not {data_format(config)}"
    elif config.model.name.startswith("timm:") or config.model.weights != "none":
        why = f"model: the peers build untrained torchvision / keras.applications models, not {config.model.name}"
    elif isinstance(config.optimizer.lr, str):
        why = f"optimizer.lr={config.optimizer.lr}: the peers need a number (--lr)"
    elif not isinstance(d.workers, int):
        why = f"data.workers={d.workers}: the peers take a number of loader workers"
    elif aug.preset != "imagenet" or not aug.random_resized_crop or aug.policy != "none" or aug.random_erase:
        why = "data.augment: the peers do the imagenet-style random resized crop only"
    elif d.mixup_alpha or d.cutmix_alpha or d.eval_crop != 1.0:
        why = "data.mixup_alpha/cutmix_alpha/eval_crop: not in the peers"
    elif config.optimizer.name not in ("sgd", "adamw"):
        why = f"optimizer.name={config.optimizer.name}: the peers take sgd or adamw"
    elif config.schedule.name not in ("cosine", "constant"):
        why = f"schedule.name={config.schedule.name}: the peers take cosine or constant"
    elif config.training.label_smoothing or config.horovod.backward_passes_per_step != 1:
        why = "training.label_smoothing / horovod.backward_passes_per_step: not in the peers"
    if why:
        raise UserError(f"--runners ddp/keras: {why}")


def flags(config: Config, world_size: int, target: float) -> list[str]:
    """The script's flags for hvdcls's recipe at `world_size` workers of training.batch_size."""
    from hvdcls.data.presets import hflip_probability
    from hvdcls.training.schedule import warmup_epochs

    t, opt, sch, d = config.training, config.optimizer, config.schedule, config.data
    out = ["--target", str(target), "--epochs", str(t.epochs), "--batch-size", str(t.batch_size),
           "--lr", repr(peak_lr(opt, world_size, 1, t.batch_size)), "--optimizer", opt.name,
           "--momentum", repr(opt.momentum), "--weight-decay", repr(opt.weight_decay),
           "--schedule", sch.name, "--warmup-epochs", repr(warmup_epochs(sch, t.epochs)),
           "--warmup-start-factor", repr(sch.warmup_start_factor), "--min-lr-factor", repr(sch.min_lr_factor),
           "--image-size", str(d.image_size), "--scale", *map(repr, d.augment.scale),
           "--ratio", *map(repr, d.augment.ratio), "--hflip", repr(hflip_probability(d, "imagenet")),
           "--mean", *map(repr, d.mean), "--std", *map(repr, d.std), "--seed", str(t.seed),
           "--model", config.model.name, "--workers", str(d.workers)]
    return out + (["--nesterov"] if opt.nesterov else [])


def data_path(config: Config, scratch: Path) -> Path:
    """What the script reads: the user's ImageFolder as it is, or the digits' split for the
    run's seed written once under `scratch`."""
    if config.data.path and data_format(config) == "imagefolder":
        return Path(config.data.path)
    return write_split(config, scratch / f"digits-seed{config.training.seed}.npz")


def write_split(config: Config, path: Path) -> Path:
    """The digits as hvdcls splits them for this config's seed, as uint8 arrays, once."""
    if path.exists():
        return path
    import numpy as np  # here: `hvdcls --help` builds the bench's flags from this package

    from hvdcls.data import datasets

    data = datasets.digits(config)

    def arrays(split):
        images = np.stack([np.asarray(split.image(i)) for i in range(len(split))])
        return images, np.asarray([split.label(i) for i in range(len(split))], np.int64)

    (train_x, train_y), (val_x, val_y) = arrays(data.train), arrays(data.val)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, train_images=train_x, train_labels=train_y, val_images=val_x, val_labels=val_y)
    tmp.replace(path)
    return path


def command(runner: str, np_: int, script_dir: Path, script_flags: list[str]) -> list[str]:
    program = [sys.executable, str(script_dir / SCRIPTS[runner]), *script_flags]
    return peers.command("ddp", np_, program) if runner == "ddp" else program
