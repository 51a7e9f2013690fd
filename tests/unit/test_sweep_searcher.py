"""The sweep's searcher (hvdcls.sweep.searcher): Optuna's pruning decisions on made-up per-epoch
curves, the suggestions each kind of parameter gets, and what Optuna would refuse, as one line."""
import math

import pytest

from hvdcls.errors import UserError
from hvdcls.sweep import searcher
from hvdcls.sweep.searcher import SearchSettings
from hvdcls.sweep.space import parse

SPACE = parse(["optimizer.lr=tag(log,interval(0.01,1.0))", "training.batch_size=choice(32,64,128)",
               "optimizer.weight_decay=range(0,0.001,0.0002)", "training.epochs=3"])


def study(**settings):
    return searcher.open_study(None, SearchSettings(**settings), SPACE)


def finished(study_, curve: list[float]) -> None:
    """A trial that ran `curve` to its end."""
    trial = study_.ask()
    for epoch, value in enumerate(curve, 1):
        assert not searcher.report(trial, epoch, value)
    searcher.finish(study_, trial.number, "done", curve[-1])


def decisions(study_, curve: list[float]) -> list[bool]:
    """Whether a new trial with `curve` is pruned at each epoch (it goes on either way)."""
    trial = study_.ask()
    return [searcher.report(trial, epoch, value) for epoch, value in enumerate(curve, 1)]


def test_median_prunes_a_curve_below_the_finished_trials_median():
    s = study(pruner="median", prune_after=2)
    finished(s, [0.5, 0.7, 0.9])
    finished(s, [0.6, 0.8, 0.9])
    assert decisions(s, [0.2, 0.3, 0.4]) == [True, True, True]
    assert decisions(s, [0.9, 0.95, 0.97]) == [False, False, False]
    assert decisions(s, [0.6, 0.5, 0.95]) == [False, True, False]  # below the median at epoch 2 only


def test_median_waits_for_prune_after_finished_trials_and_the_warmup():
    s = study(pruner="median", prune_after=2)
    finished(s, [0.9, 0.9])
    assert decisions(s, [0.1, 0.1]) == [False, False]  # one trial finished: no median yet
    s = study(pruner="median", prune_after=1, warmup_epochs=1)
    finished(s, [0.9, 0.9])
    assert decisions(s, [0.1, 0.1]) == [False, True]  # epoch 1 is the warm-up


def test_minimize_prunes_the_high_curves():
    s = study(pruner="median", prune_after=1, direction="minimize")
    finished(s, [1.0, 0.5])
    assert decisions(s, [2.0, 1.5]) == [True, True]
    assert decisions(s, [0.5, 0.2]) == [False, False]


def test_asha_keeps_the_best_of_each_rung():
    s = study(pruner="asha", reduction_factor=2)
    first, second = s.ask(), s.ask()  # side by side: neither has finished
    assert not searcher.report(first, 1, 0.8)  # alone at rung epoch 1: promoted
    assert searcher.report(second, 1, 0.3)  # of two there, only the best goes on
    assert not searcher.report(s.ask(), 1, 0.9)


def test_no_pruner_never_prunes_but_a_diverged_trial_stops():
    s = study(pruner="none")
    finished(s, [0.9, 0.9])
    finished(s, [0.9, 0.9])
    assert decisions(s, [0.0, 0.0]) == [False, False]
    assert decisions(s, [math.nan]) == [True]


def test_suggestions_lie_in_the_space_and_ranges_give_their_own_values():
    s = study(sampler="random", seed=3)
    for _ in range(20):
        values = searcher.suggest(s.ask(), SPACE)
        assert set(values) == {"optimizer.lr", "training.batch_size", "optimizer.weight_decay"}  # fixed: not asked
        assert 0.01 <= values["optimizer.lr"] <= 1.0
        assert values["training.batch_size"] in (32, 64, 128)
        assert values["optimizer.weight_decay"] in (0.0, 0.0002, 0.0004, 0.0006, 0.0008)


def test_the_grid_visits_every_point_once():
    space = parse(["training.batch_size=choice(32,64)", "optimizer.weight_decay=range(0,0.0004,0.0002)"])
    s = searcher.open_study(None, SearchSettings(sampler="grid", seed=1), space)
    seen = set()
    for _ in range(searcher.grid_size(space)):
        trial = s.ask()
        seen.add(tuple(searcher.suggest(trial, space, grid=True).values()))
        searcher.finish(s, trial.number, "done", 0.5)
    assert seen == {(32, 0.0), (32, 0.0002), (64, 0.0), (64, 0.0002)}


@pytest.mark.parametrize("items, settings, words", [
    (["training.epochs=3"], {}, "nothing varies"),
    (["optimizer.lr=interval(0.1,1)"], {"sampler": "grid"}, "a grid needs choice() or range()"),
    (["data.augment.scale=choice([0.5,1.0],[0.7,1.0])"], {}, "a list is a fixed value"),
])
def test_what_optuna_would_refuse_is_one_line(items, settings, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        searcher.check(parse(items), SearchSettings(**settings))


def test_a_study_on_disk_is_continued_and_its_direction_kept(tmp_path):
    s = searcher.open_study(tmp_path, SearchSettings(), SPACE)
    finished(s, [0.5])
    again = searcher.open_study(tmp_path, SearchSettings(), SPACE)
    assert [searcher.state_of(t) for t in again.trials] == ["done"]
    with pytest.raises(UserError, match="is to maximize the metric, not to minimize"):
        searcher.open_study(tmp_path, SearchSettings(direction="minimize"), SPACE)
