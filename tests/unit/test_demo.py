"""`hvdcls demo`'s table, from summaries shaped like the ones `hvdcls train` writes
(the training runs themselves are tests/parallel)."""
from hvdcls.checks.demo import COLUMNS, TARGET_ACCURACY, summarise, table


def summary(accuracy: float, digests=("a", "a")) -> dict:
    return {"world_size": len(digests), "val_accuracy": accuracy, "best_val_accuracy": accuracy,
            "images_per_sec": 1234.56, "rank_weight_digests": list(digests)}


def test_a_run_above_target_with_equal_weights_is_ok():
    row = summarise("torch", summary(0.9916), 24.94)
    assert row == {"backend": "torch", "ranks": 2, "val_accuracy": 0.9916, "best_val_accuracy": 0.9916,
                   "images_per_sec": 1234.6, "wall_seconds": 24.9, "same_weights": True, "ok": True}


def test_below_target_fails_the_row():
    row = summarise("tensorflow", summary(TARGET_ACCURACY - 0.01), 1.0)
    assert row["ok"] is False and row["same_weights"] is True


def test_ranks_that_disagree_fail_the_row():
    row = summarise("torch", summary(0.99, digests=("a", "b")), 1.0)
    assert row["same_weights"] is False and row["ok"] is False


def test_a_run_without_summary_fails_the_row():
    row = summarise("tensorflow", None, 3.04)
    assert row["ok"] is False and row["wall_seconds"] == 3.0 and row["val_accuracy"] == "-"
    assert set(row) == set(COLUMNS)


def test_table_aligns_columns():
    rows = [summarise("torch", summary(0.99), 20.0), summarise("tensorflow", summary(0.98), 30.0)]
    lines = table(rows).splitlines()
    assert lines[0].split() == COLUMNS
    assert [line.split()[0] for line in lines[2:]] == ["torch", "tensorflow"]
    assert lines[0].index("val_accuracy") == lines[3].index("0.98")


def test_the_demo_config_is_found_in_a_source_checkout():
    from hvdcls.checks.demo import CONFIG

    assert CONFIG.is_file(), CONFIG
