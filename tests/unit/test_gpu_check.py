"""tools/gpu_check.py (each step's record, the summary table, issue 15's targets) and
tools/gpu_check.sh's refusals of bad input. The script's run itself: tests/parallel/test_gpu_check.py."""
import json
import subprocess
from pathlib import Path

import gpu_check as gc
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "gpu_check.sh"


def write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def bench_cell(runner: str, rate: float, **extra) -> dict:
    return {"runner": runner, "images_per_sec": {"median": rate, "min": rate * 0.9, "max": rate * 1.1},
            "step_seconds": {"median": 256 / rate}, **extra}


def good_work(work: Path, hvdcls_rate: float = 2900.0) -> Path:
    """What every step leaves in WORK when it worked."""
    write(work / "build.json", {"horovod": "0.28.1", "reused": False, "build_seconds": 95.0})
    write(work / "imports.json", {"modules": {"torch": "2.11.0", "horovod": "0.28.1", "omegaconf": "2.4.0",
                                              "torchvision": "0.26.0", "hvdcls": "source tree"},
                                  "nccl_built": True, "cuda_available": True, "carried": ["omegaconf"]})
    write(work / "smoke" / "rank-0.json", {"passed": True, "controller": "gloo",
                                           "checks": [{"name": "a", "ok": True}, {"name": "b", "ok": True}]})
    write(work / "probe.json", {"ok": True, "device": "cuda:0", "result": 1.0, "expected": 1.0})
    write(work / "train" / "summary.json", {"val_accuracy": 0.97, "best_val_accuracy": 0.98,
                                            "images_per_sec": 5000.0, "wall_seconds": 20.0, "world_size": 1,
                                            "config": {"training": {"device": "cuda"}}})
    write(work / "bench" / "bench.json", {
        "spec": {"models": ["resnet50"], "image_size": 224, "batch_sizes": [256], "device": "cuda"},
        "machine": {"cores": 16},
        "cells": [bench_cell("hvdcls", hvdcls_rate), bench_cell("raw-horovod", 2950.0),
                  bench_cell("ddp", 3000.0)]})
    for loader, rate in (("hvdcls", 1500.0), ("torchvision", 1200.0)):
        write(work / f"pipeline-{loader}.json", {"loader": loader, "workers": 15, "images_per_sec": rate,
                                                 "images_per_sec_per_worker": rate / 15})
    return work


def record_all(work: Path, out: Path, mode: str = "gpu", rcs: dict | None = None) -> None:
    out.mkdir(exist_ok=True)
    for step in gc.STEPS:
        gc.write_json(out / f"{step}.json",
                      gc.record(step, work, mode, (rcs or {}).get(step, 0), 10.0, None))


def test_every_step_ok_gives_a_table_and_the_targets(tmp_path):
    record_all(good_work(tmp_path / "work"), tmp_path / "out")
    summary = gc.summarize(tmp_path / "out", "gpu")
    assert summary["ok"] and summary["seconds"] == 60.0
    assert list(summary["steps"]) == list(gc.STEPS)
    table = (tmp_path / "out" / "summary.md").read_text()
    assert "all steps ok" in table
    for step in gc.STEPS:
        assert f"| {step} | ok | 10.0 |" in table
    assert "val accuracy 0.9700" in table and "hvdcls/torch 0.967" in table
    vs_torch = summary["targets"][0]
    assert vs_torch["value"] == pytest.approx(2900 / 3000) and vs_torch["met"] is False  # < 0.97
    assert summary["targets"][1]["met"] is True  # 2900 > the A100's 2470
    feed = summary["targets"][2]
    assert feed["per_core"] == 100.0 and feed["value"] == pytest.approx(29.0)
    assert len(summary["targets"]) == 4
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written == summary and list(written["steps"]) == list(gc.STEPS)


def test_cpu_mode_does_not_claim_the_a100_target(tmp_path):
    record_all(good_work(tmp_path / "work"), tmp_path / "out", mode="cpu")
    a100 = gc.summarize(tmp_path / "out", "cpu")["targets"][1]
    assert a100["met"] is None and a100["value"] is None


@pytest.mark.parametrize("step, breakage, problem", [
    ("train", lambda w: write(w / "train" / "summary.json", {"val_accuracy": 0.5}), "val accuracy 0.5000 < 0.95"),
    ("train", lambda w: (w / "train" / "summary.json").unlink(), "no summary.json"),
    ("bench", lambda w: write(w / "bench" / "bench.json", {
        "spec": {"models": ["m"], "image_size": 1, "batch_sizes": [1], "device": "cpu"},
        "cells": [bench_cell("hvdcls", 1.0), {"runner": "ddp", "error": "exit 1: boom"}]}), "ddp: exit 1: boom"),
    ("smoke", lambda w: write(w / "probe.json", {"ok": False, "result": 0.0, "expected": 1.0}),
     "device all-reduce gave 0.0"),
    ("install", lambda w: write(w / "imports.json", {"modules": {"horovod": ""}, "nccl_built": True,
                                                      "cuda_available": True}), "cannot import horovod"),
    ("install", lambda w: write(w / "imports.json", {"modules": {"horovod": "0.28.1"}, "nccl_built": False,
                                                      "cuda_available": True}), "without NCCL"),
    ("pipeline", lambda w: (w / "pipeline-torchvision.json").unlink(), "torchvision loader wrote nothing"),
])
def test_a_broken_step_is_reported_not_hidden(tmp_path, step, breakage, problem):
    work = good_work(tmp_path / "work")
    breakage(work)
    record_all(work, tmp_path / "out")
    summary = gc.summarize(tmp_path / "out", "gpu")
    assert not summary["ok"] and not summary["steps"][step]["ok"]
    assert problem in summary["steps"][step]["result"]
    assert f"| {step} | FAILED |" in (tmp_path / "out" / "summary.md").read_text()
    assert [name for name, s in summary["steps"].items() if not s["ok"]] == [step]


def test_a_horovod_that_did_not_build_is_the_one_install_problem(tmp_path):
    """As on the H200 (2026-12-04): no Horovod, yet torch sees the GPU; no NCCL noise."""
    work = good_work(tmp_path / "work")
    write(work / "imports.json", {"modules": {"horovod": "", "torch": "2.11.0"}, "cuda_available": True,
                                  "gpu": "NVIDIA H200", "error": "ModuleNotFoundError: horovod"})
    found, problems = gc.extract_install(work, "gpu")
    assert problems == ["cannot import horovod"] and found["gpu"] == "NVIDIA H200"


def test_exit_status_and_timeouts_fail_a_step_whatever_it_wrote(tmp_path):
    work = good_work(tmp_path / "work")
    log = tmp_path / "bench.log"
    log.write_text("\n".join(f"line {i}" for i in range(100)))
    timed_out = gc.record("bench", work, "gpu", 124, 240.0, log)
    assert not timed_out["ok"] and timed_out["timed_out"] and timed_out["problems"][0] == "timed out"
    assert timed_out["log_tail"][-1] == "line 99" and len(timed_out["log_tail"]) == gc.LOG_TAIL_LINES
    assert gc.record("train", work, "gpu", 1, 3.0, log)["problems"] == ["exit 1"]
    skipped = gc.record("pipeline", work, "gpu", 124, 0.0, None, skipped="no time left")
    assert not skipped["ok"] and skipped["problems"] == ["skipped: no time left"]


def test_a_step_that_never_ran_fails_the_summary(tmp_path):
    record_all(good_work(tmp_path / "work"), tmp_path / "out")
    (tmp_path / "out" / "pipeline.json").unlink()
    summary = gc.summarize(tmp_path / "out", "gpu")
    assert not summary["ok"] and "no result" in summary["steps"]["pipeline"]["result"]
    assert gc.main(["summarize", "--out", str(tmp_path / "out"), "--mode", "gpu"]) == 1


def run_script(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **env})


@pytest.mark.parametrize("env, args, message", [
    ({"MODE": "tpu"}, (), "MODE must be gpu or cpu, not 'tpu'"),
    ({"MODE": "cpu", "HOROVOD_BUILD": "maybe"}, (), "HOROVOD_BUILD must be build, nccl or reuse"),
    ({"MODE": "gpu", "HOROVOD_BUILD": "reuse"}, (), "the GPU mode always builds"),
    ({"MODE": "gpu", "HOROVOD_BUILD": "nccl"}, (), "HOROVOD_BUILD=nccl is for MODE=cpu"),
    ({"MODE": "cpu", "HOROVOD_BUILD": "nccl", "CARRY": "/nonexistent"}, (), "missing /nonexistent/horovod"),
    ({"MODE": "cpu", "HOROVOD_BUILD": "reuse", "PREVIOUS": "/nonexistent"}, (), "holds no step records"),
    ({"MODE": "gpu", "CARRY": "/nonexistent"}, (), "missing /nonexistent/horovod-0.28.1.tar.gz"),
    ({"MODE": "cpu", "CARRY": "/nonexistent"}, (), "run tools/gpu_check.sh --prepare"),
    ({"MODE": "cpu", "PYTHON": "/no/python"}, (), "no Python '/no/python'"),
    ({}, ("--frobnicate",), "unknown argument '--frobnicate'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, env, args, message):
    result = run_script({"OUT": str(tmp_path / "out"), **env}, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()  # nothing was started


def test_gpu_mode_needs_the_carried_wheels_too(tmp_path):
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "horovod-0.28.1.tar.gz").write_bytes(b"")
    result = run_script({"MODE": "gpu", "CARRY": str(carry), "OUT": str(tmp_path / "out")})
    assert result.returncode == 2 and "missing the omegaconf wheel" in result.stderr
    # and cffi, which Horovod's setup.py needs to build (the H200 has none, and no network)
    (carry / "omegaconf-2.4.0-py3-none-any.whl").write_bytes(b"")
    result = run_script({"MODE": "gpu", "CARRY": str(carry), "OUT": str(tmp_path / "out")})
    assert result.returncode == 2 and "missing the cffi wheel" in result.stderr


def test_previous_and_out_must_differ(tmp_path):
    """The second try writes a new OUT beside the first try's records, never over them."""
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "build.json").write_text("{}")
    result = run_script({"MODE": "cpu", "HOROVOD_BUILD": "reuse", "PREVIOUS": str(tmp_path / "first"),
                         "OUT": str(tmp_path / "first") + "/"})
    assert result.returncode == 2 and "OUT and PREVIOUS are one directory" in result.stderr


def test_a_second_try_carries_over_what_the_first_passed(tmp_path):
    """PREVIOUS: a step the first try passed keeps its record, marked, and costs no seconds."""
    first, second = tmp_path / "first", tmp_path / "second"
    record_all(good_work(tmp_path / "work"), first, rcs={"bench": 124})
    assert gc.passed(first / "train.json") and not gc.passed(first / "bench.json")
    assert not gc.passed(tmp_path / "missing.json")
    second.mkdir()
    for step in ("smoke", "train", "pipeline"):
        gc.write_json(second / f"{step}.json", gc.carried_over(first / f"{step}.json"))
    for step in ("build", "install", "bench"):
        gc.write_json(second / f"{step}.json", gc.record(step, tmp_path / "work", "gpu", 0, 7.0, None,
                                                         cpu_seconds=20.0))
    summary = gc.summarize(second, "gpu", table=tmp_path / "table.md")
    assert summary["ok"] and summary["seconds"] == 21.0  # this try's three steps only
    assert summary["steps"]["train"]["previous"] and not summary["steps"]["bench"]["previous"]
    assert summary["steps"]["bench"]["cpu_seconds"] == 20.0
    table = (tmp_path / "table.md").read_text()
    assert "val accuracy 0.9700" in table and "(first try) |" in table.split("| train |")[1].split("\n")[0]
    assert not (second / "summary.md").exists()  # the table went where it was asked


def wheel_with_info(directory: Path, size: int) -> Path:
    directory.mkdir(parents=True)
    wheel = directory / "horovod-0.28.1-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"w" * size)
    write(directory / "build-info.json", {"build_seconds": 150.0, "inputs": {"horovod": "0.28.1",
                                                                            "gpu_operations": "NCCL"}})
    return wheel


def test_a_built_wheel_goes_back_with_out_when_it_fits(tmp_path, monkeypatch):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    monkeypatch.setattr(gc, "RETURNED_FILE_LIMIT", 1000)
    info = gc.built(work, wheel_with_info(tmp_path / "small", 1000), out)
    assert info["wheel_in_out"] and (out / info["wheel"]).stat().st_size == 1000
    assert read(work / "build.json")["build_seconds"] == 150.0
    (out / info["wheel"]).unlink()
    info = gc.built(work, wheel_with_info(tmp_path / "large", 1001), out)
    assert info["wheel_in_out"] is False and not list(out.iterdir())
    # The second try: the first try's wheel, its build record's numbers, nothing copied back.
    first = tmp_path / "first"
    first.mkdir()
    write(first / "build.json", {"ok": True, "results": {"horovod": "0.28.1", "build_seconds": 150.0}})
    info = gc.built(work, first / "x.whl", out, previous=first / "build.json")
    assert info["reused"] == "first try" and info["build_seconds"] == 150.0 and not list(out.iterdir())
    step = gc.record("build", work, "gpu", 0, 4.0, None)
    assert gc.headline(step) == "Horovod 0.28.1, the first try's wheel"


def test_a_cpu_run_of_the_nccl_build_must_have_nccl(tmp_path):
    """HOROVOD_BUILD=nccl (the rehearsal): the CPU mode checks what the GPU mode would."""
    work = good_work(tmp_path / "work")
    write(work / "imports.json", {"modules": {"horovod": "0.28.1"}, "nccl_built": False})
    assert gc.extract_install(work, "cpu")[1] == []
    write(work / "build.json", {"horovod": "0.28.1", "inputs": {"gpu_operations": "NCCL"}})
    assert gc.extract_install(work, "cpu")[1] == ["Horovod was built without NCCL"]


def read(path: Path) -> dict:
    return json.loads(path.read_text())
