"""One small real `hvdcls bench --to-accuracy`: the digits written as an ImageFolder of PNG
files, np=2 under horovodrun, both backends, with the plain peers beside them (torchrun + DDP at
np=2, one process of Keras fit), each reading the folder through its own framework's loader, one
run each, the digits' recipe given as settings. Every cell finishes, converges and reports
positive finite seconds, epochs and images; bench.json, bench.md and bench.png are written (and
no temporary file is left)."""
import json
import math
import subprocess

import pytest

from hvdcls.launching import launch
from tests.image_tree import write_digits_imagefolder

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(600)]
TARGET = 0.8  # digits pass it in an epoch or two; the epoch limit leaves room for a slow one
# The digits' own defaults (hvdcls.config.DIGITS_DEFAULTS), which a directory does not get.
DIGITS_RECIPE = ("data.image_size=16", "data.eval_crop=1.0", "data.workers=0", "data.augment.preset=imagenet",
                 "data.augment.scale=[0.7,1.0]", "data.augment.ratio=[0.8,1.25]", "data.augment.hflip=0",
                 "data.mean=[0.5,0.5,0.5]", "data.std=[0.5,0.5,0.5]", "optimizer.weight_decay=5e-4",
                 "schedule.warmup_epochs=1")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-accuracy")
    folder = write_digits_imagefolder(tmp_path_factory.mktemp("digits-folder"), scale=2)
    result = subprocess.run(launch.hvdcls_command(
        "bench", "--to-accuracy", str(TARGET), "--backends", "torch", "tensorflow", "--np", "2",
        "--runs", "1", "--max-epochs", "4", "--runners", "hvdcls", "ddp", "keras", "--lr", "0.4",
        "--output-dir", str(out), "--quiet", f"data.path={folder}", *DIGITS_RECIPE),
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return out, json.loads((out / "bench.json").read_text())


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_every_cell_converged_with_positive_finite_times(report):
    _, data = report
    assert {(c["runner"], c["backend"], c["np"]) for c in data["cells"]} == {
        ("hvdcls", "torch", 2), ("hvdcls", "tensorflow", 2), ("ddp", "torch", 2), ("keras", "tensorflow", 1)}
    for cell in data["cells"]:
        assert "error" not in cell, cell
        assert cell["model"] == "compact_cnn" and cell["dataset"] == "imagefolder", cell
        assert cell["converged"] and cell["converged_runs"] == cell["runs"] == 1, cell
        for name in ("seconds", "epochs", "images"):
            assert all(positive(v) for v in cell[name].values()), (name, cell)
        run = cell["run_results"][0]
        assert run["best_accuracy"] >= TARGET and 1 <= run["epochs"] <= 4
        # the run stopped at the target: the epoch that reached it was its last
        assert run["epochs_run"] == run["epochs"]
        assert run["images"] == run["epochs"] * (run["images"] // run["epochs"])
        if cell["runner"] == "hvdcls":  # start-up counts: more than the process's own clock
            assert run["seconds"] >= run["summary_seconds_to_target"] > 0


def test_the_table_and_the_plot_were_written(report):
    out, data = report
    table = (out / "bench.md").read_text()
    assert f"--to-accuracy {TARGET:g}" in table and table.count("| sgd |") == len(data["cells"])
    assert (out / "bench.png").stat().st_size > 0
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
