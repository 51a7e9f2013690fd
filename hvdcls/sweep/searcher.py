"""The searcher: an Optuna study over a sweep's space, kept in SQLite beside the sweep, with no
service I/O in it (hvdcls.sweep.driver feeds it the epochs it sees). Its decisions, what to
try next and whether a trial should stop, are Optuna's:

    tpe     TPESampler (the first few trials at random, then Bayesian); constant liar, so that
            trials running side by side are not suggested alike
    random  RandomSampler
    grid    GridSampler over every value of choice() and range() (no interval()); the sweep
            runs at most the grid's size
    median  MedianPruner: stop a trial whose epoch is worse than the median of the finished
            trials at that epoch, once `prune_after` trials have finished
    asha    SuccessiveHalvingPruner (ASHA): rungs at epochs 1, r, r^2, ...; a trial reaching a
            rung goes on only if it is in the best 1/r of those that reached it

optuna is imported only here and only when a sweep runs (hvdcls[sweep]; requirements/sweep.txt).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from hvdcls.errors import UserError
from hvdcls.sweep.space import Parameter

if TYPE_CHECKING:
    import optuna

STUDY_FILE = "study.db"
STUDY_NAME = "hvdcls-sweep"
INSTALL = "the sweep's searcher needs optuna: pip install 'hvdcls[sweep]' (requirements/sweep.txt), or make setup"
GRID_CHOICES = (type(None), bool, int, float, str)  # what Optuna's categorical values may be


@dataclass(frozen=True)
class SearchSettings:
    sampler: str = "tpe"
    pruner: str = "median"
    direction: str = "maximize"
    seed: Optional[int] = None
    prune_after: int = 2  # median: finished trials before any is pruned
    warmup_epochs: int = 0  # median: epochs of a trial never pruned
    reduction_factor: int = 2  # asha: 1/r of a rung goes on
    startup_trials: int = 4  # tpe: random trials before the model


def _optuna():
    try:
        import optuna
    except ImportError:
        raise UserError(INSTALL) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own lines
    return optuna


def grid_space(params: Sequence[Parameter]) -> dict[str, list]:
    """Every value of each varied parameter: GridSampler's search space."""
    space = {}
    for param in varied(params):
        if param.kind == "interval":
            raise UserError(f"--sampler grid: {param.key} is an interval(); a grid needs choice() or range()")
        space[param.key] = list(param.values)
    return space


def grid_size(params: Sequence[Parameter]) -> int:
    return math.prod(len(values) for values in grid_space(params).values())


def varied(params: Sequence[Parameter]) -> list[Parameter]:
    return [p for p in params if p.kind != "fixed"]


def check(params: Sequence[Parameter], settings: SearchSettings) -> None:
    """What Optuna would refuse, as one line, before a study is made."""
    if not varied(params):
        raise UserError("sweep space: nothing varies (give at least one choice(), range() or interval())")
    for param in varied(params):
        if param.kind == "choice" and not all(isinstance(v, GRID_CHOICES) for v in param.values):
            raise UserError(f"sweep space: {param.key}: choice() values must be numbers, strings or "
                            "booleans (a list is a fixed value, not a choice)")
    if settings.sampler == "grid":
        grid_space(params)


def sampler(settings: SearchSettings, params: Sequence[Parameter]):
    optuna = _optuna()
    if settings.sampler == "grid":
        return optuna.samplers.GridSampler(grid_space(params), seed=settings.seed)
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    return optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=settings.startup_trials,
                                      constant_liar=True)


def pruner(settings: SearchSettings):
    optuna = _optuna()
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=settings.prune_after,
                                           n_warmup_steps=settings.warmup_epochs + 1)  # steps: epochs, from 1
    if settings.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=settings.reduction_factor)
    return optuna.pruners.NopPruner()


def open_study(out_dir: Optional[Path], settings: SearchSettings, params: Sequence[Parameter]) -> "optuna.Study":
    """The sweep's study: DIR/study.db, made or, when there, continued (None: in memory)."""
    optuna = _optuna()
    storage = f"sqlite:///{Path(out_dir).absolute() / STUDY_FILE}" if out_dir is not None else None
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME, direction=settings.direction,
                                sampler=sampler(settings, params), pruner=pruner(settings), load_if_exists=True)
    found = study.direction.name.lower()
    if found != settings.direction:  # Optuna would go on with the study's own
        raise UserError(f"{out_dir}: its study is to {found} the metric, not to {settings.direction}")
    return study


def suggest(trial: "optuna.Trial", params: Sequence[Parameter], grid: bool = False) -> dict[str, Any]:
    """A value for every varied parameter, as the trial's config takes it."""
    return {param.key: _suggest_one(trial, param, grid) for param in varied(params)}


def _suggest_one(trial, param: Parameter, grid: bool) -> Any:
    if param.kind == "choice" or grid:
        return trial.suggest_categorical(param.key, list(param.values))
    if param.kind == "range":
        assert param.low is not None and param.high is not None and param.step is not None
        if param.integer:
            return trial.suggest_int(param.key, int(param.low), int(param.high), step=int(param.step),
                                     log=param.log)
        picked = trial.suggest_float(param.key, param.low, param.high, step=param.step)
        return min(param.values, key=lambda v: abs(v - picked))  # exactly one of the range's values
    assert param.low is not None and param.high is not None
    if param.integer:
        return trial.suggest_int(param.key, int(param.low), int(param.high), log=param.log)
    return trial.suggest_float(param.key, param.low, param.high, log=param.log)


def report(trial: "optuna.Trial", epoch: int, value: float) -> bool:
    """Tell the study the trial's metric at `epoch`; should it stop now?"""
    if not math.isfinite(value):
        return True  # a diverged trial (nan loss) is not worth its slots
    trial.report(value, epoch)
    return should_prune(trial)


def should_prune(trial: "optuna.Trial") -> bool:
    """Stop the trial at its last reported epoch, judged against the trials finished by now?"""
    return bool(trial.should_prune())


def attach(study: "optuna.Study", number: int) -> "optuna.Trial":
    """A trial the study holds as running (a sweep interrupted while it ran), to go on with it."""
    optuna = _optuna()
    frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
    return optuna.trial.Trial(study, frozen._trial_id)


def finish(study: "optuna.Study", number: int, state: str, value: Optional[float] = None) -> None:
    """Close a trial: done (with its final metric), pruned or failed."""
    optuna = _optuna()
    states = {"done": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
              "failed": optuna.trial.TrialState.FAIL}
    if state == "done" and (value is None or not math.isfinite(value)):
        state = "failed"  # Optuna takes no complete trial without a number
    try:
        study.tell(number, value if state == "done" else None, state=states[state])
    except RuntimeError as err:  # GridSampler stops an optimize() loop at the grid's end, and the
        if "Study.stop" not in str(err):  # sweep runs none; the trial is stored all the same
            raise


STATES = {"COMPLETE": "done", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "running"}


def state_of(frozen) -> str:
    """A trial's state in the sweep's words (done, pruned, failed, running)."""
    return STATES[frozen.state.name]
