"""A sweep's search space, written in Hydra's sweep override grammar and read by hydra-core's own
parser, as framework-free parameters a searcher turns into its suggestions (docs/sweeps.md).

    optimizer.lr=tag(log,interval(0.01,1.0))          interval: a float in [0.01, 1.0], on a log scale
    training.batch_size=choice(32,64,128)             choice: one of these (also 32,64,128)
    optimizer.weight_decay=range(0,0.001,0.0002)      range: start, stop (excluded), step, as Python's
    training.epochs=4                                 fixed: the same in every trial

Tags: `log` (an interval, or a range of integers in steps of 1) and `int` (an interval of whole
numbers; an interval on an integer key is one anyway). Every key must be one of the config
schema's (hvdcls.config.schema), every value of its type; anything else is a UserError, one line.
hydra-core is imported here only, when a space is parsed (hvdcls[sweep]; requirements/sweep.txt).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import typing
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hvdcls.config.schema import Config
from hvdcls.errors import EXIT_USER_ERROR, UserError

KINDS = ("choice", "range", "interval", "fixed")
TAGS = ("log", "int")
INSTALL = ("the sweep's space needs hydra-core: `make setup`, or "
           "pip install --no-deps hydra-core==1.3.8 antlr4-python3-runtime==4.9.3")


@dataclass(frozen=True)
class Parameter:
    """One key of the space. choice: `values` in order. range: every value in `values`, and
    low, high (both taken), step. interval: low, high. fixed: the one value in `values`."""

    key: str
    kind: str  # one of KINDS
    values: tuple = ()
    low: Optional[float] = None
    high: Optional[float] = None
    step: Optional[float] = None
    log: bool = False
    integer: bool = False  # range and interval: whole numbers only

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "values": list(self.values)}


def parse(items: Sequence[str]) -> list[Parameter]:
    """The space `items` (KEY=SPEC each, as on a command line) as parameters, in their order."""
    parser = _parser()
    params: list[Parameter] = []
    for item in items:
        param = _parameter(item, _parse_one(parser, item))
        if any(p.key == param.key for p in params):
            raise UserError(f"sweep space: {param.key} is given twice")
        params.append(param)
    return params


def _parser():
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
    except ImportError:
        raise UserError(INSTALL) from None
    return OverridesParser.create()


def _parse_one(parser, item: str):
    from hydra.errors import HydraException

    try:
        override = parser.parse_override(item)
    except HydraException as err:
        raise UserError(f"sweep space: {item!r} is not a sweep override: {first_line(err)}") from None
    except Exception as err:  # Hydra's parser trips on some forms (`~key`) before it can say why
        raise UserError(f"sweep space: {item!r} is not a sweep override ({type(err).__name__})") from None
    if override.is_add() or override.is_force_add() or override.is_delete() or override.package:
        raise UserError(f"sweep space: {item!r}: only KEY=SPEC here (no +, ++, ~ or @package): "
                        "the space varies keys the config has")
    return override


def _parameter(item: str, override) -> Parameter:
    from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, RangeSweep

    key, value = override.key_or_group, override.value()
    hint = key_type(key)
    tags = set(getattr(value, "tags", ()) or ())
    unknown = sorted(tags - set(TAGS))
    if unknown:
        raise UserError(f"sweep space: {key}: unknown tag {unknown[0]!r} (tags: {', '.join(TAGS)})")
    if isinstance(value, IntervalSweep):
        param = _interval(key, value, tags, hint)
    elif isinstance(value, RangeSweep):
        param = _range(key, value, tags)
    elif isinstance(value, ChoiceSweep):
        param = Parameter(key, "choice", tuple(value.list))
    elif isinstance(value, Glob):
        raise UserError(f"sweep space: {key}: glob() picks Hydra config groups, and hvdcls has none")
    else:
        param = Parameter(key, "fixed", (value,))
    if tags and param.kind in ("choice", "fixed"):
        raise UserError(f"sweep space: {key}: tag(...) applies to interval() and range(), not to {param.kind} values")
    for candidate in (*param.values, param.low, param.high):
        if candidate is not None:
            check_value(key, candidate)
    return param


def _interval(key: str, sweep, tags: set, hint: Any) -> Parameter:
    low, high = float(sweep.start), float(sweep.end)  # the grammar has both bounds
    integer = "int" in tags or hint is int
    if integer and not (low.is_integer() and high.is_integer()):
        raise UserError(f"sweep space: {key}: an interval of whole numbers needs whole bounds, not {low:g}, {high:g}")
    if not low < high:
        raise UserError(f"sweep space: {key}: interval({low:g}, {high:g}) is empty (the first bound must be lower)")
    if "log" in tags and low <= 0:
        raise UserError(f"sweep space: {key}: a log scale needs bounds above 0, not {low:g}")
    bounds = (int(low), int(high)) if integer else (low, high)
    return Parameter(key, "interval", low=bounds[0], high=bounds[1], log="log" in tags, integer=integer)


def _range(key: str, sweep, tags: set) -> Parameter:
    integer = all(isinstance(v, int) for v in (sweep.start, sweep.stop, sweep.step))
    values = tuple(v if integer else float(f"{v:.12g}") for v in sweep.range())  # 0.0006000000000000001
    if not values:
        raise UserError(f"sweep space: {key}: range({sweep.start}, {sweep.stop}, {sweep.step}) is empty")
    step = abs(sweep.step)
    if "int" in tags and not integer:
        raise UserError(f"sweep space: {key}: tag(int, range(...)) needs whole start, stop and step")
    if "log" in tags and not (integer and step == 1 and min(values) > 0):
        raise UserError(f"sweep space: {key}: a log-scale range must be of whole numbers above 0 "
                        "in steps of 1 (else use tag(log, interval(...)))")
    return Parameter(key, "range", values, min(values), max(values), step, "log" in tags, integer)


def key_type(key: str) -> Any:
    """The schema's type of a config key (Optional[X] as X); a UserError naming an unknown one."""
    node: Any = Config
    for depth, part in enumerate(key.split(".")):
        hints = typing.get_type_hints(node) if dataclasses.is_dataclass(node) else {}
        if part not in hints:
            where = ".".join(key.split(".")[:depth]) or "the config"
            raise UserError(f"sweep space: unknown config key {key} ({where} has no {part!r}; see docs/training.md)")
        node = _unoptional(hints[part])
    if dataclasses.is_dataclass(node):
        raise UserError(f"sweep space: {key} is a section: vary its keys ({key}.<key>=...)")
    return node


def _unoptional(hint: Any) -> Any:
    if typing.get_origin(hint) is Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def check_value(key: str, value: Any) -> None:
    """`value` must be one the schema takes for `key` (its type, its choices)."""
    *sections, leaf = key.split(".")
    layer: dict = {leaf: value}
    for section in reversed(sections):
        layer = {section: layer}
    try:
        OmegaConf.merge(OmegaConf.structured(Config), layer)
    except OmegaConfBaseException as err:
        raise UserError(f"sweep space: {key}={value!r}: {first_line(err)}") from None


def first_line(err: Exception) -> str:
    message = str(getattr(err, "msg", None) or getattr(err, "message", None) or err)
    return message.splitlines()[0] if message.strip() else type(err).__name__


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m hvdcls.sweep.space KEY=SPEC ...`: the space as JSON, one parameter a line; a
    check of a space alone (`hvdcls sweep` takes the same)."""
    try:
        params = parse(sys.argv[1:] if argv is None else argv)
    except UserError as err:
        print(f"hvdcls: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    for param in params:
        print(json.dumps(param.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
