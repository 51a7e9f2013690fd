"""The one configuration: the schema (hvdcls.config.schema), YAML files, dotted overrides.

    hvdcls train --config configs/resnet50.yaml data.path=/data/imagenet optimizer.lr=0.2

Precedence, lowest first: the schema's defaults, the YAML file, `key=value` overrides, then the
torchvision-style flags (`--epochs`, `--lr`, ...). The result is validated once, here
(hvdcls.config.checks); every problem is reported as one line naming the key (a UserError,
exit status 2).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence, cast

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException, ValidationError

from hvdcls import pretrained
from hvdcls.config.checks import CHOICES, get, lr_setting, not_a_choice, validate, workers_setting  # noqa: F401 (get: API)
from hvdcls.config.schema import *  # noqa: F403 (the schema's names, where they always were)
from hvdcls.config.schema import SECTIONS, Config
from hvdcls.errors import UserError


def _one_line(err: OmegaConfBaseException, source: str) -> UserError:
    key = getattr(err, "full_key", None) or "?"
    value = getattr(err, "value", None)
    if key in CHOICES and isinstance(err, ValidationError) and not OmegaConf.is_config(value):
        return not_a_choice(key, value if value is None else str(value))
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


# A user's own images (a directory or an LMDB file): the per-256 rule with ImageNet's base rate
# is right for 90 epochs of ImageNet, not for a few epochs of a small set (issue 26 measured an
# underfit), so the learning-rate range test picks the rate (hvdcls.training.lr_find). Not
# under eval_only (nothing trains) or elastic (the sweep cannot run there); a number anywhere
# above these defaults (the file, an override, --lr) still wins.
USER_DATA_DEFAULTS = {"optimizer": {"lr": "auto"}}


def load(config_file: Optional[Path] = None, overrides: Sequence[str] = (),
         flags: Optional[dict[str, Any]] = None, settings: Optional[dict] = None) -> Config:
    """Defaults (+ DIGITS_DEFAULTS for digits, USER_DATA_DEFAULTS for a data.path) <- YAML
    file <- `settings` (a mapping shaped like the file: `hvdcls serve`'s job specs) <-
    `key=value` overrides <- flags; then validate()."""
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
    defaults = [(name, OmegaConf.create(layer)) for name, layer in _defaults_for(merged)]
    if defaults:
        merged = _merge(OmegaConf.structured(Config), [*defaults, *layers])
    try:
        config = cast(Config, OmegaConf.to_object(merged))  # resolves ${...} interpolations
    except OmegaConfBaseException as err:
        raise _one_line(err, "value") from None
    config.optimizer.lr = lr_setting(config.optimizer.lr)  # "0.05" and 1 are numbers: floats
    config.data.workers = workers_setting(config.data.workers)  # "4" too
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


def _defaults_for(merged) -> list[tuple[str, dict]]:
    """The defaults layered under everything for this data and these weights, lowest first,
    named for error lines; none: the schema's alone."""
    layers = [*_data_defaults(merged), *_weights_defaults(merged)]
    return layers


def _data_defaults(merged) -> list[tuple[str, dict]]:
    if _is_digits(merged.data):
        return [("digits defaults", DIGITS_DEFAULTS)]
    try:
        users = bool(merged.data.path) and not merged.training.eval_only and not merged.training.elastic
    except OmegaConfBaseException:  # an unresolvable value: validation names it later
        return []
    return [("user data defaults", USER_DATA_DEFAULTS)] if users else []


def _weights_defaults(merged) -> list[tuple[str, dict]]:
    """model.weights' own preprocessing (hvdcls.pretrained) as data.mean and data.std, under
    the file, the overrides and the flags: a user who sets them still wins."""
    try:
        source = pretrained.parse(merged.model.weights)
        expected = pretrained.preprocessing(source, merged.model.name)
    except OmegaConfBaseException:  # an unresolvable value: validation names it later
        return []
    if expected is None:
        return []
    return [("the weights' preprocessing", {"data": {"mean": expected.mean, "std": expected.std}})]


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
    return cast(dict, OmegaConf.to_container(_read_yaml(Path(path))))


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


def to_dict(config: Config) -> dict:
    return cast(dict, OmegaConf.to_container(OmegaConf.structured(config), resolve=True))


def to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
