"""tools/serve_utilisation.py's arithmetic: slot-seconds from samples, the summary of a
workload, the table. (The workload itself runs for minutes: by hand, docs/serve.md.)"""
import pytest

import serve_utilisation as su


def test_each_sample_holds_until_the_next_and_the_last_until_the_end():
    samples = [(0.0, 4), (10.0, 2), (12.0, 3)]
    assert su.slot_seconds(samples, end=20.0) == 4 * 10 + 2 * 2 + 3 * 8
    assert su.slot_seconds(samples, end=11.0) == 4 * 10 + 2 * 1  # nothing counted after the end
    assert su.slot_seconds([], end=5.0) == 0


def job(name, submitted, started, ended, resizes=0, steps_lost=None):
    return {"name": name, "submitted_at": submitted, "started_at": started, "ended_at": ended,
            "state": "succeeded", "resizes": resizes, "steps_lost": steps_lost}


def test_summary_of_a_workload():
    e = {**job("E", 100.0, 100.5, 160.0, resizes=3, steps_lost=4),
         "recoveries": [{"world_size": 2, "seconds": 0.4, "resumed_at_step": 12}]}
    jobs = [e, job("F1", 120.0, 121.0, 140.0),
            job("F2", 130.0, 141.0, 150.0)]
    samples = [(99.0, 0), (100.5, 4), (121.0, 4), (141.0, 4), (150.0, 1), (155.0, 4)]
    result = su.summarise(jobs, samples, total_slots=4)
    assert result["makespan_seconds"] == 60.0
    assert result["slot_seconds_available"] == 240.0
    # the sample before the first submit is left out: 4 slots from 100.5 to 150, 1 to 155, 4 to 160
    assert result["slot_seconds_used"] == pytest.approx(4 * 49.5 + 1 * 5 + 4 * 5)
    assert result["utilisation"] == pytest.approx(result["slot_seconds_used"] / 240.0)
    assert result["jobs"]["F2"] == {"wait_seconds": 11.0, "run_seconds": 9.0, "state": "succeeded",
                                    "resizes": 0, "steps_lost": None, "stalls": []}
    assert result["jobs"]["E"]["resizes"] == 3 and result["jobs"]["E"]["steps_lost"] == 4
    assert result["jobs"]["E"]["stalls"] == [(2, 0.4)]


def test_table_has_a_column_per_variant_and_the_ratio():
    jobs = [job("E", 0.0, 0.0, 100.0, 2, 0), job("F1", 10.0, 10.0, 50.0), job("F2", 20.0, 20.0, 60.0)]
    fast = su.summarise(jobs, [(0.0, 4)], 4)
    slow = su.summarise([{**j, "ended_at": j["ended_at"] * 2} for j in jobs], [(0.0, 2)], 4)
    text = su.table({"elastic": fast, "fixed": slow})
    assert text.splitlines()[0] == "| | elastic | fixed |"
    assert "| makespan (s) | 100 | 200 |" in text and "| slot utilisation | 100% | 50% |" in text
    assert "makespan elastic / fixed: 0.50" in text
    assert "| E: seconds without a step at each resize (to N workers) | none | none |" in text
