"""The sweep's driver (hvdcls.sweep.driver) and what it leaves (hvdcls.sweep.results), against a
stand-in for the service's jobs (pure logic: the real service is tests/parallel/test_sweep.py's):
at most K jobs at once, each epoch to the searcher, a pruned trial's job cancelled, states done,
pruned and failed; a study with finished and running trials continued, not restarted; the job
spec a trial becomes; trials.csv/json, best.yaml (which `hvdcls train --config` loads) and the plot."""
import csv
import dataclasses
import json
import re

import pytest

from hvdcls import config as cfg
from hvdcls.errors import UserError
from hvdcls.serve.spec import JobSpec
from hvdcls.sweep import command, results, searcher, trials
from hvdcls.sweep.driver import Driver, Limits
from hvdcls.sweep.jobs import ServiceJobs
from hvdcls.sweep.searcher import SearchSettings
from hvdcls.sweep.space import parse
from hvdcls.sweep.trials import JobView

SPACE = parse(["optimizer.lr=choice(0.4,0.0001)", "training.batch_size=choice(32,64)", "training.epochs=3"])
PLAN = trials.Plan(base={"model": {"name": "compact_cnn"}, "data": {"name": "digits"}}, fixed={"training.epochs": 3},
                   name="t")
GOOD, BAD = [0.6, 0.8, 0.9], [0.1, 0.1, 0.12]  # val_accuracy per epoch, by learning rate


class FakeJobs:
    """Jobs that finish one epoch per poll, on a curve picked by the trial's learning rate."""

    def __init__(self, refuse=None, fail_lr=None, slow_lr=None):
        self.specs, self.state, self.epochs, self.cancelled = {}, {}, {}, []
        self.most_at_once, self.refuse, self.fail_lr, self.slow_lr = 0, refuse, fail_lr, slow_lr
        self.polls: dict[int, int] = {}

    def submit(self, spec: dict) -> int:
        if self.refuse:
            raise UserError(self.refuse)
        job_id = len(self.specs) + 1
        self.specs[job_id], self.state[job_id], self.epochs[job_id] = spec, "running", 0
        self.most_at_once = max(self.most_at_once, sum(s == "running" for s in self.state.values()))
        return job_id

    def poll(self, job_id: int) -> JobView:
        lr = self.specs[job_id]["settings"]["optimizer"]["lr"]
        self.polls[job_id] = self.polls.get(job_id, 0) + 1
        if self.state[job_id] == "running" and (lr != self.slow_lr or self.polls[job_id] % 2 == 0):
            self.epochs[job_id] += 1  # the slow learning rate's jobs: an epoch every second poll
            if lr == self.fail_lr:
                self.state[job_id] = "failed"
            elif self.epochs[job_id] == 3:
                self.state[job_id] = "succeeded"
        curve = GOOD if lr == 0.4 else BAD
        records = {e: {"epoch": e, "val_accuracy": curve[e - 1]} for e in range(1, self.epochs[job_id] + 1)}
        return JobView(self.state[job_id], records, "boom: out of memory" if self.state[job_id] == "failed" else None)

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)
        self.state[job_id] = "cancelled"


def sweep(study, jobs, n=4, parallel=2, grid=True):
    lines = []
    Driver(study, SPACE, PLAN, jobs, Limits(n, parallel, grid=grid, poll_seconds=0), say=lines.append,
           sleep=lambda s: None).run()
    return lines


def grid_study(tmp_path=None, seed=4, **settings):  # 4: the grid runs both lr=0.4 first
    return searcher.open_study(tmp_path, SearchSettings(sampler="grid", seed=seed, prune_after=1, **settings), SPACE)


def test_every_trial_ends_done_or_pruned_and_pruned_jobs_are_cancelled(tmp_path):
    study, jobs = grid_study(tmp_path), FakeJobs()
    sweep(study, jobs)
    table = results.rows(study.trials)
    assert len(table) == 4 and jobs.most_at_once <= 2
    by_lr = {(r.params["optimizer.lr"], r.params["training.batch_size"]): r for r in table}
    assert {r.state for r in table} <= {"done", "pruned"}
    first_good = min((r for r in table if r.params["optimizer.lr"] == 0.4), key=lambda r: r.number)
    assert first_good.state == "done" and first_good.epochs == {1: 0.6, 2: 0.8, 3: 0.9}
    pruned = [r for r in table if r.state == "pruned"]
    assert pruned and all(r.params["optimizer.lr"] == 0.0001 for r in pruned)
    assert sorted(jobs.cancelled) == sorted(r.job_id for r in pruned)
    assert all(jobs.epochs[r.job_id] < 3 for r in pruned)  # stopped before their last epoch
    assert len(by_lr) == 4  # the whole grid


def test_a_trial_whose_epoch_came_before_the_others_finished_is_pruned_when_they_finish():
    """Three at once: the two good trials finish (poll 3) while the bad one, slower, is between
    its epochs 1 and 2. Its epoch 1 came when no trial had finished (prune_after=1: no verdict);
    it is judged again as they finish, and stopped at epoch 1, not left to run on."""
    study, jobs = grid_study(), FakeJobs(slow_lr=0.0001)
    lines = sweep(study, jobs, n=3, parallel=3)
    [bad] = [r for r in results.rows(study.trials) if r.params["optimizer.lr"] == 0.0001]
    assert bad.state == "pruned" and bad.epochs == {1: 0.1} and jobs.epochs[bad.job_id] == 1, lines
    assert jobs.cancelled == [bad.job_id] and f"trial {bad.number}: pruned at epoch 1 (val_accuracy 0.1000)" in lines


def test_a_failed_job_is_a_failed_trial_with_its_reason():
    study, jobs = grid_study(pruner="none"), FakeJobs(fail_lr=0.0001)
    sweep(study, jobs, parallel=1)
    failed = [r for r in results.rows(study.trials) if r.state == "failed"]
    assert len(failed) == 2 and all(r.message == "boom: out of memory" for r in failed)


def test_a_refused_first_submission_stops_the_sweep_and_is_not_a_trial():
    study = grid_study()
    with pytest.raises(UserError, match="422: config data.path"):
        sweep(study, FakeJobs(refuse="422: config data.path: not under the service's data roots"))
    assert results.rows(study.trials) == []


def test_a_resumed_sweep_follows_its_running_trials_and_adds_only_the_missing_ones(tmp_path):
    study, jobs = grid_study(tmp_path), FakeJobs()
    first = Driver(study, SPACE, PLAN, jobs, Limits(4, 2, grid=True, poll_seconds=0), say=lambda line: None,
                   sleep=lambda s: None)
    first.resume()
    first.start()
    first.start()
    for running in list(first.active.values()):
        first.follow(running)  # one epoch each, then the sweep is "interrupted"
    again = grid_study(tmp_path)  # the same command again: the same study.db
    lines = sweep(again, jobs)
    assert sum("following job" in line for line in lines) == 2
    table = results.rows(again.trials)
    assert len(table) == 4 and len(jobs.specs) == 4  # two followed again, two new: none restarted
    assert {r.state for r in table} <= {"done", "pruned"}
    assert sweep(grid_study(tmp_path), jobs) == [] and len(jobs.specs) == 4  # N reached: nothing to do


def test_a_trial_is_a_job_spec_of_its_settings_and_mlflow_overrides():
    plan = trials.Plan(base={"optimizer": {"name": "sgd", "lr": 0.1}, "training": {"epochs": 9}},
                       fixed={"training.epochs": 2}, backend="tensorflow", np=2, name="digits",
                       mlflow_uri="http://127.0.0.1:5000", mlflow_parent="abc123")
    spec = trials.job_spec(plan, 7, {"optimizer.lr": 0.05, "training.batch_size": 64})
    assert spec == {"backend": "tensorflow", "np": 2, "name": "digits-t7",
                    "settings": {"optimizer": {"name": "sgd", "lr": 0.05}, "training": {"epochs": 2, "batch_size": 64}},
                    "overrides": ["output.mlflow_uri=http://127.0.0.1:5000", "output.mlflow_parent_run=abc123"]}
    assert plan.base == {"optimizer": {"name": "sgd", "lr": 0.1}, "training": {"epochs": 9}}  # not changed
    assert trials.job_spec(PLAN, 0, {})["overrides"] == []


def test_a_trials_job_carries_its_sweep_tag_as_the_service_takes_it():
    plan = dataclasses.replace(PLAN, sweep_id="t-0a1b2c3d", metric="val_loss", direction="minimize", trials=12)
    spec = trials.job_spec(plan, 3, {"optimizer.lr": 0.4, "training.batch_size": 32})
    assert spec["sweep"] == {"id": "t-0a1b2c3d", "name": "t", "trial": 3, "metric": "val_loss", "trials": 12,
                             "direction": "minimize", "params": {"optimizer.lr": 0.4, "training.batch_size": 32}}
    assert JobSpec(**spec).sweep.trial == 3  # the service's own check
    assert "sweep" not in trials.job_spec(PLAN, 0, {})


def test_the_sweep_id_is_made_once_and_kept_in_its_study(tmp_path):
    first = command.sweep_id(grid_study(tmp_path), "digits")
    assert re.fullmatch(r"digits-[0-9a-f]{8}", first)
    assert command.sweep_id(grid_study(tmp_path), "digits") == first  # the same command again: the same sweep


def test_a_pruned_trials_job_is_cancelled_as_pruned():
    calls = []

    class Client:
        def call(self, method, path, **options):
            calls.append((method, path, options))

    ServiceJobs(Client()).cancel(5)
    assert calls == [("POST", "/jobs/5/cancel", {"params": {"reason": "pruned"}})]


def test_each_trial_is_submitted_with_an_idempotency_key_of_its_own():
    """Through the client's submit, which sends a cut request again with the same key."""
    keys = []

    class Client:
        def submit(self, spec, key):
            keys.append(key)
            return {"id": len(keys)}, False

    jobs = ServiceJobs(Client())
    assert [jobs.submit({"name": "digits-t0"}), jobs.submit({"name": "digits-t1"})] == [1, 2]
    assert keys[0].startswith("digits-t0-") and keys[1].startswith("digits-t1-") and len(set(keys)) == 2


def test_a_jobs_view_joins_its_history_and_its_last_epoch():
    job = {"state": "running", "last_metrics": {"epoch": 3, "val_accuracy": 0.7}, "message": None}
    found = trials.view(job, [{"epoch": 1, "val_accuracy": 0.5}, {"epoch": 2, "val_accuracy": None}])
    assert trials.values(found.records, "val_accuracy") == {1: 0.5, 3: 0.7}
    assert not found.final and trials.view({"state": "cancelled"}).final


def test_results_table_best_yaml_and_plot(tmp_path):
    study = grid_study(tmp_path)
    sweep(study, FakeJobs())
    table = results.rows(study.trials)
    top = results.write(tmp_path, table, PLAN, "val_accuracy", "maximize")
    assert top is not None and top.value == 0.9 and top.params["optimizer.lr"] == 0.4
    rows = list(csv.DictReader((tmp_path / results.TABLE).open()))
    assert [r["trial"] for r in rows] == ["0", "1", "2", "3"]
    assert {r["state"] for r in rows} <= {"done", "pruned"} and "val_accuracy@3" in rows[0]
    saved = json.loads((tmp_path / results.TABLE_JSON).read_text())
    assert [t["state"] for t in saved["trials"]] == [r.state for r in table]
    best = cfg.load(tmp_path / results.BEST)  # as `hvdcls train --config best.yaml` reads it
    assert best.optimizer.lr == 0.4 and best.training.batch_size == top.params["training.batch_size"]
    assert best.training.epochs == 3 and best.model.name == "compact_cnn" and best.output.mlflow_parent_run is None
    assert (tmp_path / results.PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_best_so_far_follows_the_direction():
    rows = [results.Row(n, s, n, v, {}, {}) for n, s, v in
            [(0, "done", 0.5), (1, "pruned", 0.9), (2, "done", 0.7), (3, "failed", None), (4, "done", 0.6)]]
    assert results.best_so_far(rows, "maximize") == [0.5, 0.5, 0.7, 0.7, 0.7]
    assert results.best_so_far(rows, "minimize") == [0.5, 0.5, 0.5, 0.5, 0.5]
    assert results.best(rows, "minimize").number == 0


@pytest.mark.parametrize("extra, words", [
    (["optimizer.lrr=choice(0.1,0.2)"], "unknown config key optimizer.lrr"),
    (["optimizer.lr=choice(0.1,0.2)", "--trials", "0"], "--trials 0: must be >= 1"),
    (["optimizer.lr=choice(0.1,0.2)", "--metric", "accuracy"], "--metric accuracy: not a number of metrics.jsonl"),
    (["optimizer.lr=interval(0.1,0.2)", "--sampler", "grid"], "a grid needs choice() or range()"),
    (["optimizer.lr=choice(0.1,0.2)", "training.epochs=0"], "training.epochs"),
    (["optimizer.lr=choice(0.1,0.2)", "--url", "http://127.0.0.1:9"], "no hvdcls service answers at"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_job(extra, words, tmp_path, capsys):
    from hvdcls.cli import main

    assert main(["sweep", *extra, "--output-dir", str(tmp_path / "out"), "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # nothing made either


def test_help_imports_neither_optuna_nor_mlflow_nor_httpx():
    import subprocess
    import sys

    code = ("import sys\nfrom hvdcls.cli import main\nassert main(['sweep', '--help']) == 0\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'optuna', 'mlflow', 'httpx', 'hydra'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


def test_values_that_make_a_config_that_cannot_train_fail_that_trial_without_a_job():
    space = parse(["training.epochs=choice(0,2)"])  # each value alone is an int; 0 epochs is not a run
    study, jobs = searcher.open_study(None, SearchSettings(sampler="grid", seed=4, pruner="none"), space), FakeJobs()
    plan = trials.Plan(base={}, fixed={"optimizer.lr": 0.4})
    Driver(study, space, plan, jobs, Limits(2, 1, grid=True, poll_seconds=0), say=lambda line: None,
           sleep=lambda s: None).run()
    states = {r.params["training.epochs"]: (r.state, r.job_id, r.message) for r in results.rows(study.trials)}
    assert states[0][:2] == ("failed", None) and "training.epochs" in states[0][2]
    assert states[2][0] == "done" and len(jobs.specs) == 1
