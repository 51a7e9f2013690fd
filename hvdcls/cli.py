"""The `hvdcls` command.

    hvdcls doctor [--smoke] [--json]        is this installation ready to train?
    hvdcls demo [--np 2]                    2-rank smoke job, both backends, both launchers
    horovodrun -np 2 -H localhost:2 --gloo hvdcls smoke --backend torch
    mpirun -np 2 --allow-run-as-root hvdcls smoke --backend tensorflow

Subcommands import their module only when chosen, and no module here imports a framework at
import time: `hvdcls --help` stays fast and works without torch or tensorflow.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from hvdcls import __version__, registry
from hvdcls.errors import EXIT_USER_ERROR, UserError


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the problem (the full usage is one --help away)."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_doctor(sub) -> None:
    parser = sub.add_parser("doctor", help="check versions, the Horovod build and the launchers")
    parser.add_argument("--smoke", action="store_true",
                        help="also launch the 2-rank smoke job under horovodrun --gloo and mpirun")
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.doctor").main(a.smoke, a.json))


def add_smoke(sub) -> None:
    parser = sub.add_parser("smoke", help="Horovod collectives + one optimizer step, checked on every rank")
    parser.add_argument("--backend", choices=registry.names(), required=True)
    parser.add_argument("--report-dir", type=Path, help="write rank-N.json here")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.smoke").run(a.backend, a.report_dir))


def add_demo(sub) -> None:
    parser = sub.add_parser("demo", help="the smoke job for both backends under both launchers")
    parser.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.demo").run(a.np))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="hvdcls", description="Horovod image-classification training "
                                     "for PyTorch and TensorFlow.")
    parser.add_argument("--version", action="version", version=f"hvdcls {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=OneLineParser)
    for add in (add_doctor, add_smoke, add_demo):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's usage errors exit 2 already; keep --help's 0
        return int(exit_.code or 0)
    try:
        return args.handler(args)
    except UserError as err:
        print(f"hvdcls: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
