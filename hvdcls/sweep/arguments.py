"""`hvdcls sweep`'s flags: argparse alone, so that `hvdcls --help` imports neither optuna, httpx,
mlflow nor the config; hvdcls.sweep.command runs it."""
from __future__ import annotations

import importlib
from pathlib import Path

from hvdcls import flags, registry
from hvdcls.serve.commands import add_connection

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "asha", "none")
DIRECTIONS = ("maximize", "minimize")


def add_parser(sub) -> None:
    """`hvdcls sweep`'s flags (argparse only: optuna, httpx and mlflow are imported when it runs)."""
    parser = sub.add_parser("sweep", help="search hyperparameters: each trial a job of `hvdcls serve`, "
                            "Optuna's searcher and pruning (docs/sweeps.md)",
                            description="A space in Hydra's sweep grammar over a base config; trials run as "
                            "service jobs, at most --parallel at once; results in --output-dir.")
    parser.add_argument("overrides", nargs="*", metavar="KEY=SPEC",
                        help="the space: optimizer.lr=tag(log,interval(0.01,1)) training.batch_size=choice(32,64); "
                        "a plain KEY=VALUE is the same in every trial")
    parser.add_argument("--config", type=Path, help="the base config (YAML, as for hvdcls train)")
    flags.old_spellings(parser, parser.add_argument(
        "--output-dir", type=Path, required=True, metavar="DIR", help="the sweep's directory: study.db (the same "
        "DIR again resumes), trials.csv/json, best.yaml, sweep.png"), "--out")
    parser.add_argument("--trials", type=int, default=12, metavar="N", help="default 12")
    parser.add_argument("--parallel", type=int, default=2, metavar="K", help="trials at once (default 2)")
    parser.add_argument("--backend", choices=registry.names(), default="torch")
    parser.add_argument("--np", type=int, default=1, help="processes (slots) per trial (default 1)")
    parser.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    parser.add_argument("--pruner", choices=PRUNERS, default="median")
    parser.add_argument("--metric", default="val_accuracy", help="a number of each epoch's record "
                        "(default val_accuracy)")
    parser.add_argument("--direction", choices=DIRECTIONS, default="maximize")
    flags.old_spellings(parser, parser.add_argument("--sampler-seed", type=int, help="the sampler's seed"), "--seed")
    parser.add_argument("--prune-after", type=int, default=2, metavar="N",
                        help="median: no pruning before N trials have finished (default 2)")
    # not --warmup-epochs: that is the learning rate's warmup (schedule.warmup_epochs) wherever it appears
    flags.old_spellings(parser, parser.add_argument("--grace-epochs", type=int, default=0, metavar="E", help="median: "
                        "no trial is pruned in its first E epochs (default 0)"), "--warmup-epochs")
    parser.add_argument("--reduction-factor", type=int, default=2, metavar="R",
                        help="asha: the best 1/R of a rung go on (default 2)")
    parser.add_argument("--mlflow", metavar="URI", help="the sweep as an MLflow parent run, each trial a child run")
    parser.add_argument("--name", help="the trials' job names: NAME-tN (default: DIR's name)")
    parser.add_argument("--poll-seconds", type=float, default=1.0, help="between looks at the jobs (default 1)")
    add_connection(parser, "--server")
    parser.set_defaults(handler=lambda a: importlib.import_module("hvdcls.sweep.command").run(a))
