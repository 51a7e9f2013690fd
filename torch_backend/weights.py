"""model.weights for the PyTorch backend: a model's initial weights from torchvision's weight
enums, a file or an hvdcls run (hvdcls.pretrained says which), fitted to the model built.

    model.weights=DEFAULT            torchvision's loader, from $TORCH_HOME/hub/checkpoints when there
    model.weights=r18.pth            .pth/.pt/.bin (a state dict, plain or nested as timm and
                                     torchvision's scripts write it) or .safetensors
    model.weights=runs/pets          a torch run's newest checkpoint (its EMA when it kept one)

Every tensor of the model must come from the source with its shape, except the classifier
head (left as initialised when the class count differs) and a ViT's position embedding of
another grid (interpolated). Anything else that does not fit is a one-line UserError naming
the tensor. Rank 0 reads and loads, the backend's broadcast makes the other ranks alike.

Mirror: tf_backend/weights.py.
"""
from __future__ import annotations

import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from hvdcls import pretrained
from hvdcls.errors import UserError
from hvdcls.models import COMPACT_CNN, normalise_name
from torch_backend import consolidate
from torch_backend.models import TIMM_PREFIX, torchvision_names

if TYPE_CHECKING:
    from hvdcls.config import Config
    from hvdcls.inference.run import RunModel

CHECKPOINT_FILE = "torch.pt"  # what TorchBackend.save writes into a checkpoint directory
# Where checkpoints nest their state dict: timm's train.py, torchvision's references and
# hvdcls's own torch.pt, Lightning; and the prefixes DDP and torch.compile put on each key.
NESTED_KEYS = ("state_dict", "model", "module")
KEY_PREFIXES = ("module.", "_orig_mod.")
POSITION_EMBEDDING = "encoder.pos_embedding"  # torchvision's VisionTransformer's
# BatchNorm's step counter: absent from old files, and nothing a forward pass reads.
OPTIONAL_SUFFIX = "num_batches_tracked"


@dataclass
class Tensors:
    """A weights source read a tensor at a time: each tensor's shape by name, and how to read one."""

    shapes: dict[str, tuple[int, ...]]
    read: Callable[[str], torch.Tensor]
    origin: str  # for error lines: "model.weights=r18.pth"


@dataclass
class Fit:
    """How a source's tensors go into a model: copied as they are, or interpolated to a grid."""

    copied: list[str] = field(default_factory=list)
    interpolated: dict[str, int] = field(default_factory=dict)  # key -> the model's grid side
    report: dict[str, list[str]] = field(default_factory=lambda: {"replaced": [], "interpolated": []})


def load_initial_weights(model: nn.Module, config: Config, rank: int = 0,
                         share: Optional[pretrained.Share] = None) -> dict:
    """Read model.weights into `model` (built for `config`, on the host, before any wrapping).
    `share` (the backend's broadcast_object): rank 0 alone reads, and its outcome reaches every
    rank, a UserError included, so no rank waits in a collective; None (elastic mode, where
    build runs no collective): this rank reads itself. Returns model_info's "weights":
    {"source", "replaced", "interpolated"} (what the banner prints)."""
    source = pretrained.parse(config.model.weights)
    if source.kind == "none":
        return {"source": source.describe(), "replaced": [], "interpolated": []}

    def load() -> dict:
        return {"source": source.describe(), **load_weights(model, source, config.model.name)}

    return pretrained.read_on_rank0(load, rank, share)


def load_weights(model: nn.Module, source: pretrained.WeightsSource, model_name: str) -> dict:
    """`source`'s tensors fitted into `model`; returns {"replaced", "interpolated"}."""
    tensors = read_source(source, model_name)
    fit = match(model, tensors, model_name)
    copy_in(model, tensors, fit)
    return fit.report


def read_source(source: pretrained.WeightsSource, model_name: str) -> Tensors:
    origin = f"model.weights={source.value}"
    if source.kind == "framework":
        return framework_tensors(source.value, model_name)
    if source.kind == "run":
        from hvdcls.inference.run import open_run

        run = open_run(source.path, "model.weights")
        return read_run_tensors(run, f"{origin} (a {run.card.model} run)")
    return file_tensors(source.path, origin)


def framework_weights(name: str, model_name: str):
    """torchvision's weights enum member `name` (any case) for `model_name`; a name the model
    has no weights for is a one-line UserError listing those it has."""
    if normalise_name(model_name) == normalise_name(COMPACT_CNN) or model_name.startswith(TIMM_PREFIX):
        raise UserError(f"model.weights={name}: {model_name} has no torchvision weights; "
                        "give a weights file or an hvdcls run")
    import torchvision

    tv_name = torchvision_names().get(normalise_name(model_name), model_name)
    try:
        enum = torchvision.models.get_model_weights(tv_name)
    except (ValueError, KeyError):
        raise UserError(f"model.weights={name}: torchvision has no weights for {model_name}") from None
    names = list(enum.__members__)
    found = next((n for n in names if n.upper() == name.upper()), None)
    if found is None:
        raise UserError(f"model.weights={name}: torchvision has no such weights for {tv_name}; "
                        f"it has {', '.join(names)}")
    return enum[found]


def framework_tensors(name: str, model_name: str) -> Tensors:
    """torchvision's own loader: the hub cache's copy when there, else a download."""
    weights = framework_weights(name, model_name)
    try:
        state = weights.get_state_dict(progress=False)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
        raise UserError(f"model.weights={name}: cannot read torchvision's {weights} ({first_line(err)}); "
                        f"without a network, put {weights.url} at {cached}") from None
    return in_memory(state, f"model.weights={name} ({weights})")


def file_tensors(path: Path, origin: str) -> Tensors:
    """A .safetensors file (read a tensor at a time) or a torch pickle (memory-mapped)."""
    try:
        if path.suffix == ".safetensors":
            return safetensors_tensors(path, origin)
        return in_memory(state_dict_of(torch_load(path), origin), origin)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise UserError(f"{origin}: unreadable: {first_line(err)}") from None


def safetensors_tensors(path: Path, origin: str) -> Tensors:
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except SafetensorError as err:
        raise UserError(f"{origin}: unreadable: {first_line(err)}") from None
    stored_names = handle.keys()  # a safe_open handle is not iterable
    names = {strip_prefixes(k): k for k in stored_names}
    shapes = {k: tuple(handle.get_slice(stored).get_shape()) for k, stored in names.items()}
    return Tensors(shapes, lambda key: handle.get_tensor(names[key]), origin)


def torch_load(path: Path) -> Any:
    """torch.load, tensors only (weights_only), memory-mapped where the file's format allows."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):  # the legacy (pre-zip) format cannot be mapped
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def state_dict_of(loaded: Any, origin: str) -> dict[str, torch.Tensor]:
    """The state dict in a loaded checkpoint: itself, or nested under NESTED_KEYS."""
    if not isinstance(loaded, dict):
        raise UserError(f"{origin}: holds a {type(loaded).__name__}, not a state dict")
    for key in NESTED_KEYS:
        if isinstance(loaded.get(key), dict):
            return state_dict_of(loaded[key], origin)
    tensors = {k: v for k, v in loaded.items() if isinstance(k, str) and torch.is_tensor(v)}
    if not tensors:
        raise UserError(f"{origin}: holds no tensors (looked for a state dict, and under "
                        f"{', '.join(NESTED_KEYS)})")
    return {strip_prefixes(k): v for k, v in tensors.items()}


def strip_prefixes(key: str) -> str:
    for prefix in KEY_PREFIXES:
        while key.startswith(prefix):
            key = key[len(prefix):]
    return key


def in_memory(state: dict[str, torch.Tensor], origin: str) -> Tensors:
    state = {strip_prefixes(k): v for k, v in state.items()}
    return Tensors({k: tuple(v.shape) for k, v in state.items()}, state.__getitem__, origin)


def read_run_tensors(run: RunModel, origin: str) -> Tensors:
    """The model state of an hvdcls run's checkpoint: torch.pt's "model", with its "ema"
    entries over it when the run's card says the EMA's weights are the ones to use; a
    training.zero=3 checkpoint's parameters read one at a time from its ranks' shard files
    (torch_backend/consolidate.py). Another backend's run is a one-line UserError."""
    path, state = run_state(run)
    try:
        from_shards = consolidate.sharded_model(run.checkpoint_dir, state, str(path))
        if from_shards is not None:
            return Tensors(from_shards.shapes, from_shards.read, origin)
        weights = dict(state["model"])
        if run.use_ema and state.get("ema"):
            weights.update(state["ema"])  # floating entries only: BN's step counts stay the model's
    except (OSError, RuntimeError, KeyError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None
    return in_memory(weights, origin)


def run_state(run: RunModel) -> tuple[Path, dict]:
    """The run's torch.pt (memory-mapped) and its path; another backend's run is a one-line UserError."""
    if run.backend != "torch":
        raise UserError(f"{run.run_dir} was trained by the {run.backend} backend; the torch backend "
                        f"reads torch runs (export it, or train with --backend {run.backend})")
    path = run.checkpoint_dir / CHECKPOINT_FILE
    try:
        return path, torch_load(path)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise UserError(f"cannot read {path}: {first_line(err)}") from None


def load_run(model: nn.Module, run: RunModel) -> None:
    """The run's checkpoint into `model`, built as its card says: every tensor as it was, read
    and copied one at a time."""
    tensors = read_run_tensors(run, str(run.checkpoint_dir))
    fit = match(model, tensors, pretrained.described(run.card))
    pretrained.refuse_changes(fit.report, run.checkpoint_dir, run.card)
    copy_in(model, tensors, fit)


def head_modules(model: nn.Module, num_classes: int) -> set[str]:
    """The classifier heads: the model's last Linear (fc, classifier.N, heads.head, compact_cnn's
    last layer) and any Linear or Conv2d giving the class count (squeezenet's, auxiliary heads)."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    heads = {name for name, m in model.named_modules()
             if isinstance(m, (nn.Linear, nn.Conv2d)) and m.weight.shape[0] == num_classes}
    return heads | set(linears[-1:])


def match(model: nn.Module, tensors: Tensors, model_name: str) -> Fit:
    """Which of the source's tensors go where; the first that does not fit is a UserError."""
    target = model.state_dict()
    heads = head_modules(model, output_count(model))
    fit = Fit()
    for key, value in target.items():
        shape, theirs = tuple(value.shape), tensors.shapes.get(key)
        if not place(fit, key, shape, theirs, heads):
            what = f"it has no {key} {shape}" if theirs is None else f"{key} is {theirs} there, {shape} in the model"
            raise UserError(f"{tensors.origin} does not fit {model_name}: {what}")
    unexpected = [k for k in tensors.shapes if k not in target]
    if unexpected:
        raise UserError(f"{tensors.origin} does not fit {model_name}: it has {unexpected[0]} "
                        f"{tensors.shapes[unexpected[0]]}, which the model has not "
                        f"({len(unexpected)} such tensors)")
    return fit


def place(fit: Fit, key: str, shape: tuple[int, ...], theirs: Optional[tuple[int, ...]],
          heads: set[str]) -> bool:
    """Note in `fit` how the source's `key` (shape `theirs`, None: absent) fills the model's
    tensor of `shape`; False when it cannot."""
    if theirs == shape:
        fit.copied.append(key)
        return True
    if theirs is None:
        return key.endswith(OPTIONAL_SUFFIX)  # left as built
    module = key.rpartition(".")[0]
    if module in heads and theirs[1:] == shape[1:]:  # another class count: left as initialised
        note = f"{module}: {theirs[0]} -> {shape[0]} classes"
        if note not in fit.report["replaced"]:
            fit.report["replaced"].append(note)
        return True
    old, new = grid_side(theirs, shape[-1]), grid_side(shape, shape[-1])
    if key.endswith(POSITION_EMBEDDING) and old and new:
        fit.interpolated[key] = new
        fit.report["interpolated"].append(f"{key}: {old}x{old} -> {new}x{new} patches")
        return True
    return False


def output_count(model: nn.Module) -> int:
    """The class count: the out size of the model's last Linear or Conv2d."""
    last = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))][-1]
    return int(last.weight.shape[0])


def grid_side(shape: tuple[int, ...], width: int) -> int:
    """n for a position embedding (1, 1 + n*n, width); 0 for any other shape."""
    if len(shape) != 3 or shape[0] != 1 or shape[2] != width:
        return 0
    side = math.isqrt(shape[1] - 1)
    return side if side * side == shape[1] - 1 and side > 0 else 0


def interpolate_positions(embedding: torch.Tensor, side: int) -> torch.Tensor:
    """A ViT's position embedding (1, 1 + m*m, D) resampled to (1, 1 + side*side, D): the
    class token's kept, the m x m grid's bicubically resized as an image of D channels."""
    width, old = embedding.shape[-1], grid_side(tuple(embedding.shape), embedding.shape[-1])
    cls_token, grid = embedding[:, :1], embedding[:, 1:].float()
    grid = grid.reshape(1, old, old, width).permute(0, 3, 1, 2)
    # antialias: a grid made much smaller (224 -> 32 px images) averages rather than samples
    grid = F.interpolate(grid, size=(side, side), mode="bicubic", align_corners=False,
                         antialias=side < old)
    grid = grid.permute(0, 2, 3, 1).reshape(1, side * side, width).to(embedding.dtype)
    return torch.cat([cls_token, grid], dim=1)


@torch.no_grad()
def copy_in(model: nn.Module, tensors: Tensors, fit: Fit) -> None:
    """Each fitting tensor read and copied into the model's own (state_dict's views of them)."""
    target = model.state_dict()
    for key in fit.copied:
        target[key].copy_(tensors.read(key))
    for key, side in fit.interpolated.items():
        target[key].copy_(interpolate_positions(tensors.read(key), side))


def first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
