"""A trained model as the inference commands and model.weights find it on disk.

    RUN_DIR                       the newest checkpoint of RUN_DIR/checkpoints/
    RUN_DIR/checkpoints/epoch-N   that checkpoint

with RUN_DIR/model_card.json (hvdcls.modelcard) and RUN_DIR/config.yaml beside it. A run from
before cards were written gets one made from its config.yaml and its data's class names.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hvdcls import config as cfg
from hvdcls import modelcard
from hvdcls.errors import UserError
from hvdcls.modelcard import ModelCard
from hvdcls.training import checkpoint
from hvdcls.training.outputs import CONFIG_FILE


@dataclass(frozen=True)
class RunModel:
    """Where a trained model's weights are and how to use them."""

    card: ModelCard
    config: cfg.Config  # the run's resolved config (config.yaml)
    checkpoint_dir: Path  # RUN_DIR/checkpoints/epoch-N: the backend's files and state.json
    run_dir: Path

    @property
    def backend(self) -> str:
        return self.card.backend

    @property
    def use_ema(self) -> bool:
        """The weights evaluation uses: the EMA's when the run kept one."""
        return self.card.weights == "ema"


def open_run(path: Path, what: str = "model") -> RunModel:
    """RunModel for a run directory or a checkpoint; one-line UserError when `path` holds
    neither (`what` names the argument in it)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} {path}: no such file or directory")
    try:
        checkpoint_dir = checkpoint.resolve(path)
    except UserError:
        raise UserError(f"{what} {path}: not an hvdcls run directory or checkpoint "
                        f"(expected checkpoints/epoch-NNNN/{checkpoint.STATE_FILE})") from None
    run_dir = modelcard.run_dir_of(checkpoint_dir)
    config = read_config(run_dir, what)
    card = modelcard.find(run_dir) or card_from_config(config, checkpoint_dir)
    return RunModel(card, config, checkpoint_dir, run_dir)


def read_config(run_dir: Path, what: str) -> cfg.Config:
    config_file = run_dir / CONFIG_FILE
    if not config_file.is_file():
        raise UserError(f"{what} {run_dir}: no {CONFIG_FILE} beside its checkpoints")
    return cfg.load(config_file)


def card_from_config(config: cfg.Config, checkpoint_dir: Path) -> ModelCard:
    """A run written before model cards: the class names from its data, as training read them."""
    from hvdcls.data import datasets

    state = checkpoint.read_state(checkpoint_dir, _backend_of(checkpoint_dir)).state
    classes = datasets.open_data(config).classes
    card = modelcard.from_config(config, state["backend"], classes)
    card.weights = "ema" if config.training.ema_decay is not None else "model"
    return card


def _backend_of(checkpoint_dir: Path) -> str:
    import json

    try:
        return str(json.loads((checkpoint_dir / checkpoint.STATE_FILE).read_text())["backend"])
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"checkpoint {checkpoint_dir} is unreadable: {err}") from None
