"""A small real `hvdcls bench`: every cell and baseline runs (real horovodrun and torchrun) and
every number it reports is positive and finite; the table and the plot are written."""
import json
import math
import subprocess

import pytest

from hvdcls import launch

pytestmark = pytest.mark.parallel
NUMBERS = ["images_per_sec_per_worker", "parameters", "threads_per_rank"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = subprocess.run(launch.hvdcls_command(
        "bench", "--backends", "torch", "tensorflow", "--np", "1", "2", "--compression", "none",
        "--model", "mobilenet_v3_small", "--image-size", "32", "--batch-size", "4",
        "--warmup", "1", "--steps", "2", "--reps", "2", "--output-dir", str(out), "--quiet"),
        capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return out, json.loads((out / "bench.json").read_text())


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_every_cell_ran_with_positive_finite_numbers(report):
    _, data = report
    runners = {(c["runner"], c["backend"]) for c in data["cells"]}
    assert runners == {("hvdcls", "torch"), ("hvdcls", "tensorflow"), ("raw-horovod", "torch"),
                       ("raw-horovod", "tensorflow"), ("ddp", "torch")}
    for cell in data["cells"]:
        assert "error" not in cell, cell
        for name in NUMBERS:
            assert positive(cell[name]), (name, cell)
        for name in ("images_per_sec", "step_seconds"):
            assert all(positive(v) for v in cell[name].values()), (name, cell)
            assert cell[name]["min"] <= cell[name]["median"] <= cell[name]["max"]
        assert positive(cell["scaling_efficiency"])
        # the guard measured every cell (the share may be 0 on a quiet machine)
        assert cell["outside_cpu_share"] >= 0 and isinstance(cell["busy"], bool), cell
        if cell["np"] == 2:
            assert positive(cell["allreduce_bytes_per_step"]) and positive(cell["ring_bytes_sent_per_rank"])
        if cell["runner"] == "hvdcls" and cell["np"] == 2:
            assert positive(cell["vs_raw_horovod"])
        if cell["backend"] == "torch" and cell["np"] == 2 and cell["runner"] != "ddp":
            assert positive(cell["horovod_vs_ddp"])


def test_the_machine_and_settings_are_recorded(report):
    _, data = report
    assert data["machine"]["versions"]["horovod"] == "0.28.1"
    assert data["machine"]["usable_cores"] >= 1
    hv = next(c for c in data["cells"] if c["runner"] == "hvdcls" and c["np"] == 2)
    assert hv["horovod_settings"]["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)


def test_table_and_plot_are_written(report):
    out, data = report
    table = (out / "bench.md").read_text()
    assert table.count("\n| ") == 1 + len(data["cells"])
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
