"""The `hvdcls` command (every command and flag: docs/cli.md, made from this parser).

    hvdcls train [--backend torch|tensorflow] [--config FILE.yaml] [key=value ...]
    hvdcls lr-find [the same arguments]     the learning-rate range test: its curve, plot and pick
    hvdcls evaluate RUN_DIR [--data PATH]   top-1/top-5, per-class figures, confusion matrix
    hvdcls export RUN_DIR --format onnx -o model.onnx    a model for inference, with its classes
    hvdcls predict MODEL IMAGES... [-k 5]   classify images: a CSV (MODEL: run, checkpoint or .onnx)
    hvdcls checkpoint consolidate RUN_DIR -o FILE   training.zero=3's shard files as one file
    hvdcls data pack SRC_DIR -o OUT.lmdb    an ImageFolder directory into one LMDB file
    hvdcls doctor [--smoke] [--json]        is this installation ready to train?
    hvdcls demo [--np 2]                    digits with both backends under horovodrun, side by side
    hvdcls timeline PATH [--json]           Horovod's timeline as a few numbers (communication share)
    hvdcls report RUN_DIR [RUN_DIR ...]     runs side by side: a PNG and a Markdown table
    hvdcls bench [--np 1 2] [--model ...]   step throughput beside DDP and raw Horovod
    hvdcls bench --to-accuracy 0.9          seconds, epochs and images to a validation accuracy
    hvdcls serve --hosts a:2,b:2            a job queue over HTTP; then hvdcls job submit, list,
                                            status, logs -f, cancel (hvdcls/serve/commands.py)
    hvdcls serve --executor slurm           the same, each job an sbatch job; slurm-script prints one
    hvdcls sweep KEY=SPEC ... --output-dir DIR   a hyperparameter search, each trial a service job
    horovodrun -np 2 -H localhost:2 --gloo hvdcls smoke --backend torch
    mpirun -np 2 --allow-run-as-root hvdcls smoke --backend tensorflow

One command line: a directory of several outputs is --output-dir, a single file (or a format that
is a directory) -o/--output; a flag means one thing wherever it appears; the service's address is
--url or $HVDCLS_SERVE_URL. Former spellings still work for one release, with a note on stderr
(hvdcls.flags.old_spellings, flags.Commands).

Subcommands import their module only when chosen, and no module here imports a framework at
import time: `hvdcls --help` stays fast and works without torch or tensorflow.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import textwrap
from pathlib import Path

from hvdcls import __version__, flags, registry
from hvdcls.errors import EXIT_FAILURE, EXIT_USER_ERROR, JobStopped, UserError
from hvdcls.launching import allocator


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the problem (the full usage is one --help away)."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action, value):
        if isinstance(action, flags.Commands) and value not in action.choices:  # the choices, old names left out
            names = ", ".join(map(repr, command_helps(action)))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {names})")
        super()._check_value(action, value)


def add_doctor(sub) -> None:
    parser = sub.add_parser("doctor", help="check versions, the Horovod build and the launchers")
    parser.add_argument("--smoke", action="store_true",
                        help="also launch the 2-rank smoke job under horovodrun --gloo and mpirun")
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.checks.doctor").main(a.smoke, a.json))


def add_smoke(sub) -> None:
    parser = sub.add_parser("smoke", help="Horovod collectives + one optimizer step, checked on every rank")
    parser.add_argument("--backend", choices=registry.names(), required=True)
    flags.old_spellings(parser, parser.add_argument("--output-dir", type=Path, help="write rank-N.json here"),
                        "--report-dir")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.checks.smoke").run(a.backend, a.output_dir))


def add_demo(sub) -> None:
    parser = sub.add_parser("demo", help="train the digits with both backends under horovodrun, "
                            "side by side (make demo)")
    parser.add_argument("--np", type=int, default=2, help="ranks per job (default 2)")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.checks.demo").run(a.np))


BUILTIN_DATA = ("digits", "synthetic")
# torchvision/timm-style flags -> config keys (flags win over the file and key=value).
TRAIN_FLAGS = {"model": "model.name", "epochs": "training.epochs", "batch_size": "training.batch_size",
               "lr": "optimizer.lr", "amp": "training.amp", "resume": "training.resume",
               "output_dir": "output.dir", "workers": "data.workers", "seed": "training.seed",
               "eval_only": "training.eval_only", "metrics_port": "output.metrics_port",
               "mlflow": "output.mlflow_uri",
               "profile_steps": "training.profile_steps"}


def train_flags(args: argparse.Namespace) -> dict:
    flags = {key: getattr(args, name) for name, key in TRAIN_FLAGS.items()}
    if args.quiet:
        flags["output.progress"] = "quiet"
    if args.data in BUILTIN_DATA:
        flags.update({"data.name": args.data, "data.path": None})
    elif args.data is not None:
        flags.update({"data.name": "auto", "data.path": args.data})
    return flags


def run_train(args: argparse.Namespace) -> int:
    train = importlib.import_module("hvdcls.training.run")
    return train.run(args.backend, args.config, args.overrides, train_flags(args))


def number_or_auto(convert, what: str):
    """An argparse type: "auto", or `convert(text)` (a ValueError naming `what` for the rest)."""
    def value(text: str):
        if text == "auto":
            return text
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} or auto") from None

    return value


lr_value = number_or_auto(float, "a number")  # --lr: auto, the range test picks it
workers_value = number_or_auto(int, "a whole number")  # -j: auto, from measured times (hvdcls.data.workers)


def add_train(sub) -> None:
    parser = sub.add_parser("train", help="train a classifier (one process, or many under "
                            "horovodrun/mpirun)", description="Train an image classifier. "
                            "Settings: defaults < --config file < key=value < flags.")
    add_train_arguments(parser)
    parser.set_defaults(handler=run_train)


def run_lr_find(args: argparse.Namespace) -> int:
    command = importlib.import_module("hvdcls.training.lr_find_command")
    return command.run(args.backend, args.config, args.overrides, train_flags(args))


def add_lr_find(sub) -> None:
    parser = sub.add_parser("lr-find", help="the learning-rate range test alone: print the curve, "
                            "plot it (RUN_DIR/lr_find.png), name the rate optimizer.lr=auto takes",
                            description="The range test optimizer.lr=auto runs before training "
                            "(optimizer.lr_find.*), with the same settings as hvdcls train.")
    add_train_arguments(parser)
    parser.set_defaults(handler=run_lr_find)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """What `hvdcls train` and `hvdcls lr-find` both take: the same config keys and flags."""
    parser.add_argument("--backend", choices=registry.names(), default="torch",
                        help="default: torch")
    parser.add_argument("--config", type=Path, help="YAML file (see configs/); default: the "
                        "schema's defaults (digit-sized ones for the digits)")
    parser.add_argument("--data", help=f"{' or '.join(BUILTIN_DATA)}, or a path: an ImageFolder "
                        "directory (train/<class>/*, val/<class>/*) or an LMDB file")
    parser.add_argument("--model", help="compact_cnn, a torchvision or keras.applications name")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("-b", "--batch-size", type=int, help="per worker")
    parser.add_argument("--lr", type=lr_value, help="per 256 images of the global batch "
                        "(optimizer.scale_lr), or auto: the range test picks it (the default for "
                        "a data path)")
    parser.add_argument("--amp", action="store_true", default=None, help="mixed precision")
    parser.add_argument("--resume", help="a checkpoint or run directory")
    parser.add_argument("--output-dir", help="default runs/<timestamp>-<backend>")
    parser.add_argument("-j", "--workers", type=workers_value,
                        help="data loader workers per process, or auto: from the measured load and step times")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--eval-only", "--test-only", dest="eval_only", action="store_true",
                        default=None, help="evaluate the --resume checkpoint and stop")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on rank 0 (0: any free port, logged)")
    parser.add_argument("--mlflow", metavar="URI", help="track the run in MLflow (rank 0): params, "
                        "per-epoch metrics, tags, artifacts (output.mlflow_uri; needs hvdcls[track])")
    parser.add_argument("--profile-steps", type=int, metavar="N",
                        help="profile N steps with torch.profiler / the TF profiler into RUN_DIR/profile")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar or step/epoch lines (batch jobs)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted config overrides, e.g. optimizer.lr=0.05 horovod.compression=fp16")


def add_data(sub) -> None:
    parser = sub.add_parser("data", help="prepare data sets")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION",
                                    parser_class=OneLineParser)
    pack = actions.add_parser("pack", help="pack an ImageFolder directory into one LMDB file")
    pack.add_argument("source", type=Path, help="ImageFolder root (train/ and optional val/)")
    pack.add_argument("old_output", type=Path, nargs="?", help=argparse.SUPPRESS)  # `pack SRC OUT`, before -o
    pack.add_argument("-o", "--output", type=Path, metavar="FILE.lmdb", help="the LMDB file to write (required)")
    pack.add_argument("--quiet", action="store_true", help="no progress bar")
    pack.set_defaults(handler=run_pack)


def add_checkpoint(sub) -> None:
    parser = sub.add_parser("checkpoint", help="work on a run's checkpoints: consolidate training.zero=3's "
                            "shard files into one file")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION",
                                    parser_class=OneLineParser)
    consolidate = actions.add_parser("consolidate", help="a training.zero=3 checkpoint's per-rank slices as one "
                                     "unsharded file of the model, written a tensor at a time",
                                     description="Write a training.zero=3 run's model (its newest checkpoint, or "
                                     "the one given) as one file the backend's loaders read: torch a "
                                     ".safetensors file of its state dict, tensorflow an .npz in "
                                     "tensorflow.npz's layout (model.weights=FILE takes either). The "
                                     "optimizer's state is left in the shard files.")
    consolidate.add_argument("run", type=Path, metavar="RUN_DIR", help="a run directory or one of its checkpoints")
    consolidate.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                             help="the file to write: torch FILE.safetensors, tensorflow FILE.npz")
    consolidate.set_defaults(handler=lambda a: importlib.import_module("hvdcls.inference.consolidate").main(a))


# An old spelling a flag's alias cannot carry (docs/cli.md lists it beside the renamed flags).
OLD_POSITIONALS = {"hvdcls data pack SRC OUT": "hvdcls data pack SRC -o OUT"}


def run_pack(a: argparse.Namespace) -> int:
    output = a.output
    if a.old_output is not None:
        if output is not None:
            raise UserError(f"data pack: two LMDB files ({a.old_output} and -o {output}): give -o/--output alone")
        flags.note_renamed("hvdcls data pack", *next(iter(OLD_POSITIONALS.items())))
        output = a.old_output
    if output is None:
        raise UserError("data pack: give the LMDB file to write: -o/--output FILE.lmdb")
    return importlib.import_module("hvdcls.data.lmdb_store").main(a.source, output, not a.quiet)


def add_timeline(sub) -> None:
    parser = sub.add_parser("timeline", help="summarise a Horovod timeline: time per op, "
                            "negotiation vs all-reduce, fused bytes, communication share")
    parser.add_argument("path", type=Path, help="the file horovod.timeline=PATH wrote "
                        "(may still be growing)")
    parser.add_argument("--json", action="store_true", help="machine-readable")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.observe.timeline").main(a.path, a.json))


def add_report(sub) -> None:
    parser = sub.add_parser("report", help="compare run directories: a PNG and a Markdown table")
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR")
    parser.add_argument("-o", "--output", type=Path, default=Path("report.png"),
                        help="the PNG to write; the table goes beside it as .md (default report.png)")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.observe.report").compare(a.runs, a.output))


def add_evaluate(sub) -> None:
    parser = sub.add_parser("evaluate", help="top-1, top-5, per-class precision/recall/F1 and the "
                            "confusion matrix of a trained run (evaluation.json, confusion_matrix.csv/.png)",
                            description="Evaluate a run's model (the EMA's weights when it kept one) on "
                            "its validation split, or on another data set with the run's classes.")
    parser.add_argument("run", type=Path, metavar="RUN_DIR", help="a run directory or one of its checkpoints")
    parser.add_argument("--data", type=Path, metavar="PATH", help="an ImageFolder directory (its val/ "
                        "when it has one, else every image) or an LMDB file (its val split); "
                        "default: the run's own validation split")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=2, help="loader worker processes")
    parser.add_argument("--output-dir", type=Path, help="where the files go (default: RUN_DIR)")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.inference.evaluate").main(a))


def add_export(sub) -> None:
    parser = sub.add_parser("export", help="write a run's model for inference: torch state-dict, "
                            "torchscript, onnx; tensorflow keras, savedmodel, onnx",
                            description="Export a run's model (the EMA's weights when it kept one) with "
                            "its class names and preprocessing; the export's outputs are checked "
                            "against the framework's on one batch before it is kept.")
    parser.add_argument("run", type=Path, metavar="RUN_DIR", help="a run directory or one of its checkpoints")
    parser.add_argument("--format", required=True, metavar="FORMAT",
                        help="torch: state-dict, torchscript, onnx; tensorflow: keras, savedmodel, onnx")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="PATH",
                        help="the file to write (a directory for savedmodel)")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.inference.export").main(a))


def add_predict(sub) -> None:
    parser = sub.add_parser("predict", help="classify image files with a run, a checkpoint or an "
                            "ONNX export: a CSV of the top-k classes",
                            description="Classify images (files, or directories read recursively) "
                            "with the evaluation's preprocessing. Exit 0 when every image was read, "
                            "1 when any was skipped (named on stderr), 2 for bad input.")
    parser.add_argument("model", type=Path, metavar="MODEL",
                        help="a run directory, a checkpoint, or an .onnx file from hvdcls export")
    parser.add_argument("images", type=Path, nargs="+", metavar="IMAGES")
    parser.add_argument("-k", "--top-k", type=int, default=1, help="classes per image (default 1)")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE.csv", help="default: standard output")
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=2, help="loader worker processes")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.inference.predict").main(a))


def run_bench(a: argparse.Namespace) -> int:
    if a.target is not None:  # --to-accuracy: train to a target instead of timing steps
        accuracy = importlib.import_module("hvdcls.bench.accuracy")
        report = accuracy.run(accuracy.from_args(a), a.output_dir, progress=not a.quiet)
        print(importlib.import_module("hvdcls.bench.accuracy_report").markdown(report))
        return 1 if any("error" in c for c in report["cells"]) else 0
    importlib.import_module("hvdcls.bench.accuracy").refuse_without_target(a)
    bench = importlib.import_module("hvdcls.bench.matrix")
    report = bench.run(flags.from_args(bench.BenchSpec, a), a.output_dir, progress=not a.quiet)
    print(importlib.import_module("hvdcls.bench.report").markdown(report))
    failed = [c for c in report["cells"] if "error" in c]
    return 1 if failed else 0


def add_bench(sub) -> None:
    parser = sub.add_parser("bench", help="throughput over backend x processes x compression x batch "
                            "x model, beside DDP and raw Horovod (bench.json, bench.md, bench.png)")
    flags.add_flags(parser, importlib.import_module("hvdcls.bench.matrix").BenchSpec)  # its fields
    # --to-accuracy and its own flags; key=value settings (for its launches) come as overrides
    flags.add_flags(parser, importlib.import_module("hvdcls.bench.accuracy").AccuracySpec)
    parser.set_defaults(overrides=[])
    parser.add_argument("--output-dir", type=Path, default=Path("runs/bench"))
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run_bench)


# `hvdcls --help` lists the commands by purpose, in this order.
GROUPS = (("train and evaluate", ("train", "lr-find", "evaluate", "sweep", "report")),
          ("models", ("export", "predict", "checkpoint")),
          ("data", ("data",)),
          ("jobs and the service", ("job", "serve", "slurm-script")),
          ("measure", ("bench", "timeline")),
          ("check", ("doctor", "smoke", "demo")))
OTHER = "other"  # a command no group names (a test keeps this empty)


def grouped(commands: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(purpose, its commands) from {command: help}, GROUPS' order; the rest under OTHER."""
    out = [(title, [name for name in names if name in commands]) for title, names in GROUPS]
    named = {name for _, names in GROUPS for name in names}
    rest = [name for name in commands if name not in named]
    return [(title, names) for title, names in [*out, (OTHER, rest)] if names]


def command_helps(sub: argparse._SubParsersAction) -> dict[str, str]:
    """{command: its one-line help} of a subparsers action, old names left out."""
    return {choice.dest: choice.help or "" for choice in sub._get_subactions()}


def commands_by_purpose(sub: argparse._SubParsersAction) -> str:
    helps = command_helps(sub)
    width = max(map(len, helps)) + 4
    lines = []
    for title, names in grouped(helps):
        lines.append(f"{title}:")
        lines += [textwrap.fill(helps[name], 100, initial_indent=f"  {name:<{width - 2}}",
                                subsequent_indent=" " * width) for name in names]
        lines.append("")
    return "\n".join([*lines, "hvdcls COMMAND --help: its flags; every command and flag: docs/cli.md"])


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="hvdcls", usage="%(prog)s [-h] [--version] COMMAND ...",
                           description="Horovod image-classification training for PyTorch and TensorFlow.",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hvdcls {__version__}")
    # help=SUPPRESS: the epilog lists the commands, by purpose, in argparse's stead
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS,
                                parser_class=OneLineParser, action=flags.Commands, prog="hvdcls")
    for add in (add_train, add_lr_find, add_evaluate, add_export, add_predict, add_checkpoint, add_data, add_doctor,
                add_smoke, add_demo, add_timeline, add_report, add_bench):
        add(sub)
    importlib.import_module("hvdcls.serve.commands").add_parsers(sub)  # argparse only
    importlib.import_module("hvdcls.sweep.arguments").add_parser(sub)  # argparse only
    parser.epilog = commands_by_purpose(sub)
    return parser


SETTING = re.compile(r"^[A-Za-z_][\w.]*=")  # key=value (a config key first: not --slow-rank's 1=0.5)


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Like parse_args, but `key=value` overrides may sit between or after the flags (for the
    bench also right after a flag of several values, `--np 1 2 key=value`, which argparse would
    otherwise take for one of them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    settings = [item for item in argv[1:] if SETTING.match(item)] if argv[:1] == ["bench"] else []
    args, extra = parser.parse_known_args([item for item in argv if item not in settings])
    extra = [*extra, *settings]
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    unknown = [item for item in extra if item not in overrides]
    if unknown or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or overrides)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


# Commands whose process trains (a rank): they run on the allocator hvdcls/launching/allocator.py picks.
ALLOCATOR_COMMANDS = ("train",)
# The bench's own process stays as it is (its peers' cells inherit its environment); its hvdcls
# workers re-execute themselves, so a bad HVDCLS_ALLOCATOR is reported here, before any cell.
ALLOCATOR_CHECKED = ("bench",)


def main(argv: list[str] | None = None) -> int:
    command = sys.argv[1] if argv is None and len(sys.argv) > 1 else None
    if command in ALLOCATOR_COMMANDS + ALLOCATOR_CHECKED:
        # Started as a program (not called by a test): first re-execute with tcmalloc preloaded.
        try:
            if command in ALLOCATOR_COMMANDS:
                allocator.reexec_with_allocator()
            else:
                allocator.preload_environment(os.environ)
        except UserError as err:
            print(f"hvdcls: error: {err}", file=sys.stderr)
            return EXIT_USER_ERROR
    parser = build_parser()
    try:
        args = parse(parser, argv)
    except SystemExit as exit_:  # argparse's usage errors exit 2 already; keep --help's 0
        return int(exit_.code or 0)
    try:
        return args.handler(args)
    except UserError as err:
        print(f"hvdcls: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except JobStopped as err:
        print(f"hvdcls: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
