"""`hvdcls demo`'s summary of each launch (the launches themselves are tests/parallel)."""
from hvdcls.demo import summarise, table
from hvdcls.smoke import LocalRun


def report(rank: int, sha: str, ok: bool = True) -> dict:
    return {"rank": rank, "controller": "gloo", "weights_sha256": sha, "passed": ok,
            "checks": [{"name": "a", "ok": True, "detail": ""}, {"name": "b", "ok": ok, "detail": ""}]}


def test_a_clean_run_is_ok():
    row = summarise("torch", "horovodrun", LocalRun(0, 9.24, [report(0, "x"), report(1, "x")], ""))
    assert row == {"backend": "torch", "launcher": "horovodrun", "ranks": 2, "controller": "gloo",
                   "checks": "4/4", "same_weights": True, "seconds": 9.2, "ok": True}


def test_a_failed_check_on_one_rank_fails_the_row():
    row = summarise("torch", "mpirun", LocalRun(1, 3.0, [report(0, "x"), report(1, "y", ok=False)], ""))
    assert row["checks"] == "3/4" and not row["same_weights"] and not row["ok"]


def test_a_launch_that_wrote_nothing_fails_the_row():
    row = summarise("tensorflow", "mpirun", LocalRun(0, 1.0, [], ""))
    assert row["ranks"] == 0 and not row["ok"]


def test_table_aligns_columns():
    rows = [summarise("tensorflow", "horovodrun", LocalRun(0, 13.0, [report(0, "x")], ""))]
    lines = table(rows).splitlines()
    assert lines[0].split() == ["backend", "launcher", "ranks", "controller", "checks",
                                "same_weights", "seconds", "ok"]
    assert lines[2].split()[:2] == ["tensorflow", "horovodrun"]
    assert lines[0].index("launcher") == lines[2].index("horovodrun")
