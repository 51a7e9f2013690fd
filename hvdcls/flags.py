"""Command-line flags made from a dataclass's fields, so that a field and its flag are one fact.

    @dataclass
    class Spec:
        nps: list[int] = option([1, 2], flag="--np", help="process counts")
        image_size: int = 64                      # a plain field: --image-size IMAGE_SIZE
        timeout: int = option(900, flag=None)     # no flag

    add_flags(parser, Spec)               # one argparse flag per field, in field order
    spec = from_args(Spec, parser.parse_args())

A field's flag is `--<name with dashes>` unless `flag=` names another; its type is the field's
(`list[X]` takes one or more values: nargs="+"; `Optional[X]` is X, default None); its default is
the dataclass's own. A bool field defaulting to true becomes `--no-<name>` (store_false), one
defaulting to false `--<name>` (store_true). Framework-free, argparse only.

Old spellings, one mechanism for every command: `option(..., old=("--data",))` or
`old_spellings(parser, action, "--out")` keeps a renamed flag working, hidden from --help, and
`Commands` (a subparsers action) a renamed command; either prints one line on stderr naming the
new spelling. They go in the release after the one that renamed them.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any, Callable, Optional, Sequence, Union

_MISSING = dataclasses.MISSING


def option(default: Any = _MISSING, *, factory: Optional[Callable[[], Any]] = None,
           flag: Optional[str] = "", help: Optional[str] = None,
           choices: Optional[Sequence[Any]] = None, old: Sequence[str] = ()) -> Any:
    """A dataclass field with what its flag needs beyond the field itself. A list default is
    copied for each instance. flag: the flag's name ("" derives it from the field, None: no flag);
    old: its former names, still accepted (old_spellings)."""
    if factory is None and isinstance(default, list):
        factory, default = (lambda value=default: list(value)), _MISSING
    metadata = {"flag": flag, "help": help, "choices": None if choices is None else list(choices),
                "old": tuple(old)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _flag_name(field: dataclasses.Field, bool_default: Optional[bool]) -> Optional[str]:
    flag = field.metadata.get("flag", "")
    if flag is None or flag:
        return flag
    dashed = field.name.replace("_", "-")
    return f"--no-{dashed}" if bool_default is True else f"--{dashed}"


def _value_type(hint: Any) -> tuple[Any, bool]:
    """(the type of one value, whether the field is a list): Optional[X] -> X, list[X] -> X."""
    if typing.get_origin(hint) is Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) in (list, typing.List):
        return typing.get_args(hint)[0], True
    return hint, False


def flagged_fields(cls: type) -> list[tuple[dataclasses.Field, str]]:
    """(field, flag) for each field of `cls` that has a flag, in field order."""
    defaults = cls()
    out = []
    for field in dataclasses.fields(cls):
        default = getattr(defaults, field.name)
        name = _flag_name(field, default if isinstance(default, bool) else None)
        if name is not None:
            out.append((field, name))
    return out


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of the dataclass `cls`, its default the dataclass's."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for field, name in flagged_fields(cls):
        default = getattr(defaults, field.name)
        kwargs: dict[str, Any] = {"dest": field.name, "default": default}
        if field.metadata.get("help") is not None:
            kwargs["help"] = field.metadata["help"]
        value_type, many = _value_type(hints[field.name])
        if value_type is bool:
            kwargs["action"] = "store_false" if default else "store_true"
        else:
            if value_type is not str:
                kwargs["type"] = value_type
            if many:
                kwargs["nargs"] = "+"
            if field.metadata.get("choices") is not None:
                kwargs["choices"] = field.metadata["choices"]
            # argparse's metavar from the flag's name, as if dest were the flag (--np NP ...)
            kwargs["metavar"] = None if kwargs.get("choices") else name.lstrip("-").replace("-", "_").upper()
        old_spellings(parser, parser.add_argument(name, **kwargs), *field.metadata.get("old", ()))


def from_args(cls: type, args: argparse.Namespace) -> Any:
    """The dataclass from parsed flags; fields without a flag keep their defaults."""
    return cls(**{field.name: getattr(args, field.name) for field, _ in flagged_fields(cls)})


def note_renamed(where: str, old: str, new: str) -> None:
    """The one line an old spelling prints on stderr (stdout stays the command's own)."""
    print(f"{where}: `{old}` is now `{new}` (the old spelling goes in the next release)", file=sys.stderr)


class _Renamed(argparse.Action):
    """Mixed into a flag's own action class: notes the old names it was reached by."""

    old_names: tuple[str, ...] = ()

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.old_names:
            note_renamed(parser.prog, option_string, max(self.option_strings, key=len))
        super().__call__(parser, namespace, values, option_string)


_RENAMED: dict[type, type] = {}


def old_spellings(parser: argparse.ArgumentParser, action: argparse.Action, *old: str) -> argparse.Action:
    """Accept `old` as further names of `action`'s flag: the same action (so a required flag is
    satisfied by either), left out of --help, noting the new name when used."""
    for name in old:
        if name in parser._option_string_actions:
            raise ValueError(f"{parser.prog}: {name} is taken")
        parser._option_string_actions[name] = action
    if old:
        kind = type(action)
        if not issubclass(kind, _Renamed):
            kind = _RENAMED.setdefault(kind, type(f"Renamed{kind.__name__}", (_Renamed, kind), {}))
            action.__class__ = kind
        action.old_names = (*action.old_names, *old)  # type: ignore[attr-defined]
    return action


def renamed_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """old flag -> its new name, of this parser's flags."""
    return {name: max(action.option_strings, key=len) for action in parser._actions
            if isinstance(action, _Renamed) for name in action.old_names}


class Commands(argparse._SubParsersAction):
    """Subcommands (add_subparsers(action=Commands)), a few also reachable by a former name:
    `add_old("jobs", "job list", parser)` runs `parser` for `hvdcls jobs`, noting the new name."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.old_names: dict[str, str] = {}

    def add_old(self, old: str, new: str, parser: argparse.ArgumentParser) -> None:
        self._name_parser_map[old] = parser  # no help entry: --help lists the new names only
        self.old_names[old] = new

    def __call__(self, parser, namespace, values, option_string=None):
        if values[0] in self.old_names:
            note_renamed(parser.prog, f"{parser.prog} {values[0]}", f"{parser.prog} {self.old_names[values[0]]}")
        super().__call__(parser, namespace, values, option_string)
