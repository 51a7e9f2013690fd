"""The service's subcommands for `hvdcls`: serve, serve token, slurm-script and the job client's
`hvdcls job submit|list|status|logs|cancel` (before: flat `submit`, `jobs`, ...; still accepted).

Only argparse here: FastAPI, uvicorn and httpx are imported when a command runs, so
`hvdcls --help` works without the `hvdcls[serve]` extra.
"""
from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

from hvdcls import flags, registry
from hvdcls.serve import executors
from hvdcls.serve.slurm_options import SlurmOptions, add_flags

DEFAULT_STATE_DIR = Path(os.environ.get("HVDCLS_STATE_DIR", "~/.hvdcls/serve")).expanduser()
STATE_DIR_DEFAULT = "default $HVDCLS_STATE_DIR, else ~/.hvdcls/serve"  # the help's words (not this machine's path)
DEFAULT_PORT = 8470


def client(name: str, module: str = "hvdcls.serve.client"):
    """A handler calling <module>.<name>(args), imported on use."""
    return lambda args: getattr(importlib.import_module(module), name)(args)


def run_serve(args: argparse.Namespace) -> int:
    scheduler = importlib.import_module("hvdcls.serve.scheduler")
    from hvdcls.errors import UserError

    if args.hosts and args.hosts_file:
        raise UserError("give the host inventory with --hosts HOST:SLOTS,... or --hosts-file FILE (one)")
    if args.hosts_file and not args.hosts_file.is_file():
        raise UserError(f"--hosts-file {args.hosts_file}: no such file")
    given = args.hosts or (args.hosts_file.read_text() if args.hosts_file else None)
    inventory = scheduler.parse_hosts(given) if given is not None else {}  # the executor says if it wants one
    for root in args.data_root:
        if not root.is_absolute() or not root.is_dir():
            raise UserError(f"--data-root {root}: must be an existing directory, given as an absolute path")
    settings = importlib.import_module("hvdcls.serve.settings").Settings(
        state_dir=args.state_dir.expanduser().absolute(), inventory=inventory, data_roots=args.data_root,
        ssh_port=args.ssh_port, grace_seconds=args.grace_seconds, hang_seconds=args.hang_seconds,
        resize_cooldown_seconds=args.resize_cooldown, network_interface=args.network_interface,
        job_metrics=args.job_metrics, executor=args.executor, slurm=SlurmOptions.from_args(args))
    if args.reserve_mb < 0:
        raise UserError(f"--reserve-mb {args.reserve_mb:g}: must be >= 0")
    return importlib.import_module("hvdcls.serve.app").serve(settings, args.bind, args.port, args.open_metrics,
                                                             args.reserve_mb)


def run_slurm_script(args: argparse.Namespace) -> int:
    """Print the batch script for a spec, and write its RUN_DIR/job.yaml, for submitting by hand."""
    from pydantic import ValidationError

    from hvdcls import config as cfg
    from hvdcls.errors import UserError
    from hvdcls.files.fileio import write_atomic
    from hvdcls.serve import runner
    from hvdcls.serve import spec as job_spec
    from hvdcls.serve.executors import slurm_batch

    run_dir = args.output_dir.expanduser().absolute()
    try:
        spec = job_spec.JobSpec(np=args.np, backend=args.backend, elastic=args.elastic, min_np=args.min_np,
                                max_np=args.max_np)
    except ValidationError as err:  # the first problem, on one line
        raise UserError(f"slurm-script: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    config = cfg.load(args.config, overrides=args.overrides, flags={"training.elastic": True} if spec.elastic else None)
    options = SlurmOptions.from_args(args)
    if spec.elastic and options.launcher == "mpirun":
        raise UserError("--elastic needs horovodrun (Horovod's elastic driver), not --launcher mpirun")
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / runner.JOB_CONFIG, cfg.to_yaml(job_spec.job_config(config, run_dir)).encode())
    elastic = slurm_batch.Elastic(*spec.bounds) if spec.elastic else None
    print(slurm_batch.batch_script(args.name or "hvdcls", args.np, args.backend, run_dir, options, elastic), end="")
    return 0


def add_slurm_script(sub) -> None:
    parser = sub.add_parser("slurm-script", help="print the sbatch script that runs one training job "
                            "under Slurm (writes RUN_DIR/job.yaml; docs/serve.md)")
    parser.add_argument("--backend", choices=registry.names(), default="torch")
    parser.add_argument("--np", type=int, required=True, help="processes (Slurm tasks)")
    parser.add_argument("--config", type=Path, help="YAML file, as for hvdcls train")
    parser.add_argument("--name", help="the Slurm job name (default hvdcls)")
    flags.old_spellings(parser, parser.add_argument("--output-dir", type=Path, required=True,
                                                    help="the run's output and log directory"), "--run-dir")
    parser.add_argument("--elastic", action="store_true", help="horovodrun elastic on the allocation's "
                        "usable nodes: --max-np tasks, --no-kill, shrinks on a lost node down to --min-np")
    parser.add_argument("--min-np", type=int)
    parser.add_argument("--max-np", type=int)
    add_flags(parser, "sbatch directives")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.set_defaults(handler=run_slurm_script)


def add_serve(sub) -> None:
    parser = sub.add_parser("serve", help="a training service: a queue of jobs on a host inventory "
                            "(HTTP API; docs/serve.md)")
    parser.add_argument("--hosts", help="inventory HOST:SLOTS,... e.g. worker1:2,worker2:2")
    parser.add_argument("--hosts-file", type=Path, help="one HOST:SLOTS per line")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"job table, run directories, token ({STATE_DIR_DEFAULT})")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"0: any free port (default {DEFAULT_PORT})")
    parser.add_argument("--data-root", type=Path, action="append", default=[], metavar="DIR",
                        help="jobs may read data (and resume checkpoints) under DIR; repeatable")
    parser.add_argument("--ssh-port", type=int, help="horovodrun's -p for remote hosts")
    parser.add_argument("--grace-seconds", type=float, default=10.0,
                        help="cancel: SIGTERM, then SIGKILL after this long (default 10)")
    parser.add_argument("--hang-seconds", type=float, default=0.0,
                        help="end a running job whose status.json shows no step (nor change of phase) "
                        "for this long, as failed (0: never; a spec's hang_seconds wins)")
    parser.add_argument("--resize-cooldown", type=float, default=60.0, metavar="SECONDS",
                        help="resize an elastic job at most this often (default 60)")
    parser.add_argument("--network-interface", help="elastic jobs' horovodrun --network-interface "
                        "(e.g. lo when every host is this machine)")
    parser.add_argument("--job-metrics", action="store_true",
                        help="every job's rank 0 serves Prometheus /metrics on a free port (unless its spec "
                             "sets output.metrics_port), listed for Prometheus by GET /targets")
    parser.add_argument("--executor", choices=executors.names(), default="hosts",
                        help="hosts: the service's queue on --hosts; slurm: each job becomes an sbatch job")
    parser.add_argument("--open-metrics", action="store_true",
                        help="GET /metrics and /targets without a token (for a Prometheus that has none); "
                             "every other request still needs one")
    parser.add_argument("--reserve-mb", type=float, default=64.0, metavar="MB",
                        help="refuse submissions (HTTP 507) while the state directory's file system has "
                             "less free (default 64)")
    add_flags(parser, "--executor slurm: defaults a spec's slurm field overrides")
    parser.set_defaults(handler=run_serve)
    add_token_commands(parser)


def add_token_commands(serve: argparse.ArgumentParser) -> None:
    """`hvdcls serve token add|list|revoke`: the users, on the service's state directory."""
    token = serve.add_subparsers(dest="serve_command", metavar="token").add_parser(
        "token", help="the users and their tokens (one each) in the service's state directory")
    commands = token.add_subparsers(dest="token_command", metavar="add|list|revoke", required=True)
    add = commands.add_parser("add", help="make a user and print their token (shown once; kept hashed)")
    add.add_argument("name", help="letters, digits and _ . @ -")
    add.add_argument("--admin", action="store_true", help="may cancel any user's job")
    add.set_defaults(handler=client("run_add", "hvdcls.serve.users"))
    listed = commands.add_parser("list", help="the users: admin or not, since when")
    listed.set_defaults(handler=client("run_list", "hvdcls.serve.users"))
    revoke = commands.add_parser("revoke", help="remove a user: their token stops working at once")
    revoke.add_argument("name")
    revoke.set_defaults(handler=client("run_revoke", "hvdcls.serve.users"))
    for parser in (add, listed, revoke):
        # SUPPRESS: a --state-dir given before `token` is not undone by this parser's default.
        parser.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS,
                            help=f"the service's state directory ({STATE_DIR_DEFAULT})")


def add_connection(parser: argparse.ArgumentParser, *old_url: str) -> None:
    """How a client finds the service: the same three flags on every command that talks to it."""
    url = parser.add_argument("--url", help="the service (default: $HVDCLS_SERVE_URL, else STATE_DIR/server.json)")
    flags.old_spellings(parser, url, *old_url)
    parser.add_argument("--token", help="your token (default: $HVDCLS_SERVE_TOKEN, else STATE_DIR/token)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"where the service keeps its address and the first admin's token ({STATE_DIR_DEFAULT})")


def add_client_commands(sub) -> None:
    """`hvdcls job VERB`, as Ray's `ray job ...`; the flat verbs of before stay for one release."""
    job = sub.add_parser("job", help="the service's jobs: submit, list, status, logs, cancel "
                         "(the service: --url or $HVDCLS_SERVE_URL)",
                         description="Talk to an `hvdcls serve`: its address is --url, else $HVDCLS_SERVE_URL, "
                         "else the one STATE_DIR/server.json records.")
    verbs = job.add_subparsers(dest="job_command", required=True, metavar="VERB", action=flags.Commands)
    submit = verbs.add_parser("submit", help="queue an `hvdcls train` run on the service")
    submit.add_argument("--backend", choices=registry.names(), default="torch")
    submit.add_argument("--np", type=int, required=True, help="processes (slots), started together")
    submit.add_argument("--config", type=Path, help="YAML file, as for hvdcls train")
    submit.add_argument("--name", help="the job's name (in hvdcls job list and the console)")
    submit.add_argument("--requeue", action="store_true",
                        help="requeue (resuming) instead of failing if a restart finds it gone")
    submit.add_argument("--elastic", action="store_true",
                        help="resizable: shrunk toward --min-np while jobs wait, grown back toward --max-np")
    submit.add_argument("--min-np", type=int, help="with --elastic: the fewest processes it runs on")
    submit.add_argument("--max-np", type=int, help="with --elastic: the most processes it grows to")
    submit.add_argument("--hang-seconds", type=float, help="end it, failed, after this long without a step")
    submit.add_argument("--idempotency-key", metavar="KEY",
                        help="the submission's key (default: a new one each time): the same key again "
                             "gives back the job it made instead of a second one")
    add_flags(submit, "a service run with --executor slurm")
    submit.add_argument("overrides", nargs="*", metavar="key=value")
    submit.set_defaults(handler=client("submit"))
    jobs = verbs.add_parser("list", help="the service's queue and what runs where")
    jobs.add_argument("--state", dest="job_state", help="only jobs in this state")
    jobs.add_argument("--last", type=int, metavar="N", help="only the N newest (in submission order)")
    jobs.set_defaults(handler=client("jobs"))
    status = verbs.add_parser("status", help="one job: state, hosts, progress, last metrics, run directory")
    status.add_argument("job", type=int, help="the job's id")
    status.add_argument("--json", action="store_true", help="machine-readable")
    status.set_defaults(handler=client("status"))
    logs = verbs.add_parser("logs", help="a job's output")
    logs.add_argument("job", type=int, help="the job's id")
    logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    logs.add_argument("--stderr", action="store_true", help="its standard error instead of its output")
    logs.set_defaults(handler=client("logs"))
    cancel = verbs.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("job", type=int, help="the job's id")
    cancel.set_defaults(handler=client("cancel"))
    for parser in (submit, jobs, status, logs, cancel):
        add_connection(parser)
    for old, parser in (("submit", submit), ("jobs", jobs), ("status", status), ("logs", logs), ("cancel", cancel)):
        sub.add_old(old, parser.prog.removeprefix(f"{sub._prog_prefix} "), parser)


def add_parsers(sub) -> None:
    add_serve(sub)
    add_client_commands(sub)
    add_slurm_script(sub)
