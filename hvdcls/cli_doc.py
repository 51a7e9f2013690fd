"""docs/cli.md, made from `hvdcls`'s own parser: every command and flag with its help, by purpose,
and the old spellings still accepted. A unit test fails when the file is stale.

    python -m hvdcls.cli_doc            # rewrite docs/cli.md
    python -m hvdcls.cli_doc --check    # exit 1 when docs/cli.md is not what the parser says

Framework-free, like the parser: no torch or tensorflow is imported to write it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterator

from hvdcls import cli, flags

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"

HEADER = """# The command line

<!-- Made from the parser by `python -m hvdcls.cli_doc`; tests/unit/test_cli.py fails when it is stale. -->

Every `hvdcls` command and flag, as `hvdcls COMMAND --help` gives them, grouped as `hvdcls --help`
lists them. The same words mean the same thing in every command: a directory of several outputs
is `--output-dir`, a single file (or a format that is a directory, such as a SavedModel)
`-o/--output`, the service's address `--url` (else `$HVDCLS_SERVE_URL`). Settings of
`hvdcls train` are config keys as well (`key=value`; docs/training.md). The spellings of before
still work for one release, each with one line on stderr naming the new one: the table at the end.
"""


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


Found = tuple[list[str], argparse.ArgumentParser, str]


def walk(parser: argparse.ArgumentParser, words: list[str], help: str = "") -> Iterator[Found]:
    """(command words, parser, its one-line help) of this parser and every subcommand below it,
    in --help's order."""
    yield words, parser, help
    sub = subcommands(parser)
    if sub is not None:
        for name, line in cli.command_helps(sub).items():
            yield from walk(sub.choices[name], [*words, name], line)


def cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")


def value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        one = " \\| ".join(f"`{c}`" for c in action.choices)
    else:
        if not action.option_strings:
            return ""  # a positional: its name says it
        one = f"`{action.metavar or action.dest.upper()}`"
    return f"{one} ..." if action.nargs in ("+", "*") else one


def default(action: argparse.Action) -> str:
    """The default where the help does not say it already (and no machine's own path)."""
    found = action.default
    if (found is None or isinstance(found, bool) or found == [] or found == argparse.SUPPRESS
            or action.nargs == 0 or "default" in (action.help or "")):
        return ""
    return f"`{' '.join(map(str, found)) if isinstance(found, list) else found}`"


def rows(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        out.append(f"| {name} | {value(action)} | {default(action)} | {cell(action.help or '')} |")
    return out


def section(words: list[str], parser: argparse.ArgumentParser, help: str) -> list[str]:
    lines = [f"### hvdcls {' '.join(words)}", "", cell(parser.description or help), ""]
    sub = subcommands(parser)
    if sub is not None:
        verbs = cli.command_helps(sub)
        lines += ["Subcommands: " + ", ".join(f"`{v}`" for v in verbs) + " (below).", ""]
    table = rows(parser)
    if table:
        lines += ["| argument | value | default | help |", "|---|---|---|---|", *table, ""]
    return lines


def old_spellings(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for words, each, _ in walk(parser, []):
        where = " ".join(["hvdcls", *words])
        sub = subcommands(each)
        if isinstance(sub, flags.Commands):
            out += [f"| `{where} {old}` | `{where} {new}` |" for old, new in sub.old_names.items()]
        out += [f"| `{where} {old}` | `{where} {new}` |" for old, new in flags.renamed_flags(each).items()]
    out += [f"| `{old}` | `{new}` |" for old, new in cli.OLD_POSITIONALS.items()]
    return ["## Old spellings", "", "Accepted until the next release, each with a note on stderr.", "",
            "| old | new |", "|---|---|", *out, ""]


def markdown() -> str:
    parser = cli.build_parser()
    top = subcommands(parser)
    assert top is not None
    helps = cli.command_helps(top)
    lines = [HEADER]
    for title, names in cli.grouped(helps):
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        for name in names:
            for words, each, help in walk(top.choices[name], [name], helps[name]):
                lines += section(words, each, help)
    lines += old_spellings(parser)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    text = markdown()
    if check:
        stale = not DOC.is_file() or DOC.read_text() != text
        if stale:
            print(f"{DOC} is stale: python -m hvdcls.cli_doc rewrites it", file=sys.stderr)
        return int(stale)
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
