"""A small real `hvdcls bench`: every cell and baseline runs (real horovodrun, torchrun and
MultiWorkerMirroredStrategy workers) and every number it reports is positive and finite; the
table and the plot are written."""
import json
import math
import subprocess

import pytest

from hvdcls.launching import launch

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(1200)]  # the launch's own bound, below
NUMBERS = ["images_per_sec_per_worker", "parameters", "threads_per_rank"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = subprocess.run(launch.hvdcls_command(
        "bench", "--backends", "torch", "tensorflow", "--np", "1", "2", "--compression", "none",
        "--model", "mobilenet_v3_small", "--image-size", "32", "--batch-size", "4",
        "--warmup-steps", "1", "--steps", "2", "--reps", "2", "--output-dir", str(out), "--quiet"),
        capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return out, json.loads((out / "bench.json").read_text())


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_every_cell_ran_with_positive_finite_numbers(report):
    _, data = report
    runners = {(c["runner"], c["backend"]) for c in data["cells"]}
    assert runners == {("hvdcls", "torch"), ("hvdcls", "tensorflow"), ("raw-horovod", "torch"),
                       ("raw-horovod", "tensorflow"), ("ddp", "torch"), ("mwms", "tensorflow")}
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
        if cell["np"] == 2 and cell["runner"] in ("hvdcls", "raw-horovod"):
            assert positive(cell["horovod_vs_peer"]), cell  # DDP for torch, MWMS for TensorFlow


def test_every_hvdcls_cell_counted_its_ranks_memory(report):
    """The memory columns (`--zero` sets them against each other): every rank's tensors counted
    after the timed steps; unsharded (zero 0, the default), np=2 holds what np=1 does per rank."""
    _, data = report
    hv = [c for c in data["cells"] if c["runner"] == "hvdcls"]
    for cell in hv:
        assert cell["zero"] == 0 and len(cell["rank_memory"]) == cell["np"], cell
        assert all(positive(v) for v in cell["memory"].values()), cell
        assert cell["rank_memory"][0] == cell["memory"]  # rank 0's own, gathered with the others'
    for cell in (c for c in hv if c["np"] == 2):
        assert cell["memory_vs_np_1"] == {"optimizer_state_bytes": 1.0, "grad_bytes": 1.0}, cell
    assert all(c["memory"] is None for c in data["cells"] if c["runner"] != "hvdcls")


def test_mwms_ran_its_collectives_across_both_workers(report):
    _, data = report
    mwms = next(c for c in data["cells"] if c["runner"] == "mwms" and c["np"] == 2)
    settings = mwms["runner_settings"]
    assert settings["implementation"] == "RING" and settings["global_batch"] == 2 * 4
    assert settings["tasks"] == [0.0, 1.0]  # both workers took part in the all-gather
    # Each worker trained on its own batch; equal weights after it: the gradients were combined.
    first, second = settings["weights_fingerprints"]
    assert first > 0 and abs(first - second) <= 1e-6 * first, settings
    hv = next(c for c in data["cells"] if c["runner"] == "hvdcls" and c["backend"] == "tensorflow"
              and c["np"] == 2)
    assert hv["peer"] == "mwms" and hv["horovod_vs_peer"] == (
        hv["images_per_sec"]["median"] / mwms["images_per_sec"]["median"])


def test_the_machine_and_settings_are_recorded(report):
    _, data = report
    assert data["machine"]["versions"]["horovod"] == "0.28.1"
    assert data["machine"]["usable_cores"] >= 1
    hv = next(c for c in data["cells"] if c["runner"] == "hvdcls" and c["np"] == 2)
    assert hv["horovod_settings"]["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)


def test_table_and_plot_are_written(report):
    out, data = report
    table = (out / "bench.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    assert len([r for r in rows if r in ("hvdcls", "raw-horovod", "ddp", "mwms")]) == len(data["cells"])
    # each stack at its best: hvdcls against DDP (torch) and against MWMS (TensorFlow), np=2
    assert sorted(b["peer"] for b in data["best_vs_peer"]) == ["ddp", "mwms"]
    assert len([r for r in rows if r in ("torch", "tensorflow")]) == 2
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
