"""tools/gpu_check.sh in its CPU mode, end to end: the same steps as on the GPU host (smoke under
horovodrun, digits training, the bench beside raw Horovod and DDP, the input pipeline), tiny
sizes, reusing the Horovod installed here instead of building it (HOROVOD_BUILD=reuse).

What a GPU session runs once is thereby not run for the first time there. The carried wheels
are stood in for by one small wheel made here (no network in tests).
"""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.parallel
REPO = Path(__file__).resolve().parents[2]
STEPS = ("build", "install", "smoke", "train", "bench", "pipeline")


def probe_wheel(carry: Path) -> Path:
    """A minimal pure-Python wheel, standing in for the carried omegaconf."""
    name, version = "gpu_check_probe", "1.0"
    dist_info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 42\n",
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    wheel = carry / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_check")
    carry, out = root / "carry", root / "out"
    carry.mkdir()
    probe_wheel(carry)
    env = {**os.environ, "MODE": "cpu", "HOROVOD_BUILD": "reuse", "PYTHON": sys.executable,
           "CARRY": str(carry), "OUT": str(out), "TMPDIR": str(root),
           "BUDGET_S": "540"}  # the script ends itself, reporting, inside the test's timeout
    result = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], env=env,
                            capture_output=True, text=True, timeout=580)
    return result, out, root


def test_cpu_mode_passes_every_step(cpu_run):
    result, out, _ = cpu_run
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    # What a device run brings back (at most 8 files): one JSON per step and the summary; the
    # GPU mode adds the wheel it built, so the table goes to stdout only.
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{s}.json" for s in STEPS] + ["summary.json"])
    for step in STEPS:
        record = json.loads((out / f"{step}.json").read_text())
        assert record["ok"] and record["problems"] == [] and record["rc"] == 0, record
        assert record["mode"] == "cpu" and record["seconds"] >= 0


def test_summary_table_has_a_row_per_step(cpu_run):
    result, out, _ = cpu_run
    table = result.stdout[result.stdout.index("# GPU check"):]
    assert table.startswith("# GPU check (cpu mode): all steps ok")
    for step in STEPS:
        assert f"| {step} | ok |" in table
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and list(summary["steps"]) == list(STEPS)


def test_numbers_are_real(cpu_run):
    _, out, _ = cpu_run
    results = {step: json.loads((out / f"{step}.json").read_text())["results"] for step in STEPS}
    records = {step: json.loads((out / f"{step}.json").read_text()) for step in STEPS}
    assert all(r["cpu_seconds"] >= 0 for r in records.values())
    assert records["train"]["cpu_seconds"] > 0  # the digits' training is measured, not zero
    assert results["build"]["reused"] is True
    assert results["install"]["carried"] == ["gpu_check_probe"]
    assert results["install"]["modules"]["horovod"] == "0.28.1" and not results["install"]["nccl_built"]
    assert results["smoke"]["controller"] == "gloo" and results["smoke"]["probe"]["device"] == "cpu"
    assert results["train"]["val_accuracy"] >= 0.95 and results["train"]["device"] == "cpu"
    bench = results["bench"]
    assert set(bench["runners"]) == {"hvdcls", "raw-horovod", "ddp"}
    assert all(r["images_per_sec"] > 0 for r in bench["runners"].values())
    assert bench["hvdcls_vs_torch"] > 0 and bench["hvdcls_vs_raw_horovod"] > 0
    for loader in ("hvdcls", "torchvision"):
        assert results["pipeline"][loader]["images_per_sec_per_worker"] > 0
    targets = json.loads((out / "summary.json").read_text())["targets"]
    assert targets[1]["met"] is None  # no GPU claim from a CPU run
    assert all(t["value"] > 0 for t in targets if t["target"].startswith("cores"))


def test_carried_wheel_went_to_the_temporary_prefix_only(cpu_run):
    _, _, root = cpu_run
    # WORK (prefix included) is removed at the end; nothing was installed into this venv.
    assert not list(root.glob("gpu_check.*"))
    found = subprocess.run([sys.executable, "-c", "import gpu_check_probe"], capture_output=True)
    assert found.returncode != 0


def test_steps_out_of_time_are_recorded_as_failed_and_the_exit_says_so(tmp_path):
    """BUDGET_S=16 runs out within the first steps (how many run depends on the machine's speed:
    build always does, smoke only on fast cores): the rest are recorded as skipped, exit 1."""
    env = {**os.environ, "MODE": "cpu", "HOROVOD_BUILD": "reuse", "PYTHON": sys.executable,
           "CARRY": str(tmp_path), "OUT": str(tmp_path / "out"), "BUDGET_S": "16"}
    result = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not summary["ok"]
    skipped = [name for name, step in summary["steps"].items() if "skipped" in step["result"]]
    assert skipped and set(skipped) <= set(STEPS[1:])
    assert list(summary["steps"]) == list(STEPS)  # every step has its record, run or skipped
    table = result.stdout[result.stdout.index("# GPU check"):]
    assert table.startswith("# GPU check (cpu mode): FAILED")
    for name in skipped:
        assert f"| {name} | FAILED | 0.0 | skipped: no time left of BUDGET_S=16 |" in table


def test_a_second_try_runs_only_what_the_first_did_not_pass(cpu_run, tmp_path):
    """PREVIOUS (the first try's OUT, as it came back): smoke, train and bench passed there and
    are carried over; the pipeline, marked failed here, runs again; build and install always run."""
    _, first_out, root = cpu_run
    first = tmp_path / "first"
    first.mkdir()
    for path in first_out.glob("*.json"):
        (first / path.name).write_text(path.read_text())
    failed = {**json.loads((first / "pipeline.json").read_text()), "ok": False}
    (first / "pipeline.json").write_text(json.dumps(failed))
    env = {**os.environ, "MODE": "cpu", "HOROVOD_BUILD": "reuse", "PYTHON": sys.executable,
           "CARRY": str(root / "carry"), "OUT": str(tmp_path / "out"), "PREVIOUS": str(first),
           "BUDGET_S": "300"}
    result = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], env=env,
                            capture_output=True, text=True, timeout=360)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    records = {step: json.loads((tmp_path / "out" / f"{step}.json").read_text()) for step in STEPS}
    assert [s for s in STEPS if records[s].get("previous")] == ["smoke", "train", "bench"]
    assert records["train"] == {**json.loads((first / "train.json").read_text()), "previous": True}
    assert records["pipeline"]["ok"] and records["pipeline"]["results"]["hvdcls"]["images_per_sec"] > 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ok"] and summary["seconds"] == sum(records[s]["seconds"] for s in
                                                       ("build", "install", "pipeline"))
    assert "(first try)" in result.stdout
