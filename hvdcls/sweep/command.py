"""`hvdcls sweep`: a hyperparameter search whose trials are jobs of a running `hvdcls serve`.

    hvdcls sweep 'optimizer.lr=tag(log,interval(0.01,1.0))' 'training.batch_size=choice(32,64,128)' \\
        training.epochs=4 --config configs/digits.yaml --trials 12 --parallel 2 --pruner median \\
        --output-dir sweeps/digits [--mlflow http://127.0.0.1:5000]

Every check is made before the first job is submitted: the space (hvdcls.sweep.space), the base
config with the space's fixed values, the flags, the service's address, token and slots. The
same command again continues the sweep in DIR (its study.db) until N trials are accounted for.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import secrets
import sys
from dataclasses import fields
from typing import Optional

from hvdcls import config as cfg
from hvdcls.errors import UserError
from hvdcls.observe.monitor import EpochRecord
from hvdcls.sweep import results, searcher, space, trials
from hvdcls.sweep.driver import Driver, Limits, shown

# The numbers of a metrics.jsonl line a sweep can rank trials by.
METRICS = tuple(f.name for f in fields(EpochRecord) if str(f.type) in ("float", "Optional[float]")
                and f.name != "wall_time")
SPACE_ATTR, SWEEP_ID_ATTR = "space", "sweep_id"
SETTINGS = ("sampler", "pruner", "direction", "metric", "backend", "np")


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    params = space.parse(args.overrides)
    settings = search_settings(args)
    searcher.check(params, settings)
    plan = make_plan(args, params)
    base = trials.config(plan, {})  # the base config and the fixed values, as a trial gets them
    jobs = connect(args)
    check_slots(jobs, args)
    limit = args.trials
    if args.sampler == "grid" and searcher.grid_size(params) < limit:
        limit = searcher.grid_size(params)
        print(f"sweep: the grid has {limit} points: {limit} trials")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    study = searcher.open_study(args.output_dir, settings, params)
    check_same_sweep(study, args)
    parent = open_parent(args, study, params, base.output.mlflow_experiment)
    plan = dataclasses.replace(plan, mlflow_parent=parent.run_id if parent else None,
                               sweep_id=sweep_id(study, plan.name), trials=limit)
    return drive(args, study, params, plan, jobs, Limits(limit, args.parallel, args.metric, args.sampler == "grid",
                                                         args.poll_seconds), parent)


def check_flags(args: argparse.Namespace) -> None:
    least = {"trials": 1, "parallel": 1, "np": 1, "prune_after": 0, "grace_epochs": 0, "reduction_factor": 2}
    for name, low in least.items():
        if getattr(args, name) < low:
            raise UserError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= {low}")
    if args.metric not in METRICS:
        raise UserError(f"--metric {args.metric}: not a number of metrics.jsonl ({', '.join(METRICS)})")
    if not args.poll_seconds > 0:
        raise UserError(f"--poll-seconds {args.poll_seconds:g}: must be > 0")


def search_settings(args: argparse.Namespace) -> searcher.SearchSettings:
    return searcher.SearchSettings(sampler=args.sampler, pruner=args.pruner, direction=args.direction,
                                   seed=args.sampler_seed, prune_after=args.prune_after,
                                   warmup_epochs=args.grace_epochs,
                                   reduction_factor=args.reduction_factor,
                                   startup_trials=max(2, min(10, args.trials // 3)))


def make_plan(args: argparse.Namespace, params: list[space.Parameter]) -> trials.Plan:
    base = cfg.read_file(args.config) if args.config else {}
    fixed = {p.key: p.values[0] for p in params if p.kind == "fixed"}
    name = re.sub(r"[^A-Za-z0-9_.:@+-]", "-", args.name or args.output_dir.absolute().name).lstrip(".:@+-") or "sweep"
    return trials.Plan(base=base, fixed=fixed, backend=args.backend, np=args.np, name=name[:90],
                       mlflow_uri=args.mlflow, metric=args.metric, direction=args.direction)


def connect(args: argparse.Namespace):
    from hvdcls.serve import client
    from hvdcls.sweep.jobs import ServiceJobs

    return ServiceJobs(client.connect(args))


def check_slots(jobs, args: argparse.Namespace) -> None:
    slots = jobs.slots()  # the first call: a service that is not there is named here
    if slots is not None and args.parallel * args.np > slots:
        raise UserError(f"--parallel {args.parallel} x --np {args.np}: {args.parallel * args.np} slots, and the "
                        f"service has {slots}")


def check_same_sweep(study, args: argparse.Namespace) -> None:
    """A study already in DIR must be this sweep's: its space and settings (the trial count may grow)."""
    mine = json.dumps({"space": list(args.overrides), **{k: getattr(args, k) for k in SETTINGS},
                       "config": str(args.config) if args.config else None}, sort_keys=True)
    found = study.user_attrs.get(SPACE_ATTR)
    if found is None:
        study.set_user_attr(SPACE_ATTR, mine)
    elif found != mine:
        raise UserError(f"{args.output_dir} holds another sweep ({found}); give a new --output-dir, or the same "
                        "space and flags")


def sweep_id(study, name: str) -> str:
    """The sweep's id in the service (the tag on each trial's job): made once and kept in the
    study, so the same command again goes on under the same id."""
    found = study.user_attrs.get(SWEEP_ID_ATTR)
    if found is None:
        found = f"{name}-{secrets.token_hex(4)}"
        study.set_user_attr(SWEEP_ID_ATTR, found)
    return str(found)


def open_parent(args: argparse.Namespace, study, params, experiment: str):
    if not args.mlflow:
        return None
    from hvdcls.sweep.tracking import ParentRun

    parent = ParentRun(args.mlflow, experiment, study, f"sweep-{args.output_dir.name}")
    parent.log_space(params, {k: getattr(args, k) for k in SETTINGS} | {"trials": args.trials})
    return parent


def drive(args, study, params, plan: trials.Plan, jobs, limits: Limits, parent) -> int:
    def changed() -> None:
        results.write(args.output_dir, results.rows(study.get_trials(deepcopy=False)), plan, args.metric,
                      args.direction, plot=False)

    def closed(number: int, state: str, value: Optional[float]) -> None:
        if parent is not None and state == "done" and value is not None:
            parent.log_trial(number, args.metric, value)

    driver = Driver(study, params, plan, jobs, limits, changed=changed, closed=closed)
    status = "KILLED"
    try:
        driver.run()
        status = "FINISHED"
    except KeyboardInterrupt:
        print(f"sweep: interrupted; {len(driver.active)} trial(s) go on in the service, and the same "
              f"command continues the sweep", file=sys.stderr)
        raise
    except UserError:  # the service refused the first job, or went away: its one line says it
        status = "FAILED"
        raise
    finally:
        top = summarise(args, study, plan, say=status != "FAILED")
        if parent is not None:
            parent.end(args.output_dir, (results.TABLE, results.TABLE_JSON, results.BEST, results.PLOT),
                       top.value if top else None, args.metric, status)
    return 0 if top is not None else 1


def summarise(args, study, plan: trials.Plan, say: bool = True) -> Optional[results.Row]:
    table = results.rows(study.get_trials(deepcopy=False))
    top = results.write(args.output_dir, table, plan, args.metric, args.direction)
    if not say:
        return top
    counts = {state: sum(r.state == state for r in table) for state in ("done", "pruned", "failed", "running")}
    print(f"sweep: {len(table)} trials ({', '.join(f'{n} {s}' for s, n in counts.items() if n)}) in {args.output_dir}")
    if top is not None:
        print(f"sweep: best trial {top.number}: {args.metric} {top.value:.4f} "
              f"({shown(top.params)}): {args.output_dir / results.BEST}")
    return top


def driver_params(params: dict) -> str:
    from hvdcls.sweep.driver import shown

    return shown(params)
