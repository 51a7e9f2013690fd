"""A small real `hvdcls bench --loader imagefolder lmdb`: the bench writes its JPEGs and LMDB,
every rank reads its shard through the real loader (torch DataLoader / tf.data workers), the
imagefolder cells get their plain-framework baselines and the lmdb cells none. np=2 only, to
keep it near two minutes on 2 cores (np=1 data cells take the same worker path, minus sharding)."""
import json
import math
import subprocess

import pytest

from hvdcls.launching import launch

pytestmark = pytest.mark.parallel


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-data")
    result = subprocess.run(launch.hvdcls_command(
        "bench", "--backends", "torch", "tensorflow", "--np", "2", "--compression", "none",
        "--loader", "imagefolder", "lmdb", "--loader-workers", "1", "--model", "mobilenet_v3_small",
        "--image-size", "32", "--batch-size", "4", "--warmup-steps", "1", "--steps", "2", "--reps", "1",
        # MWMS has its own cells in test_bench.py; here the data baselines only, to keep it short
        "--baseline-runners", "raw-horovod", "ddp",
        "--output-dir", str(out), "--quiet"), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    print(result.stdout)  # the table, for whoever runs this with -s
    return out, json.loads((out / "bench.json").read_text())


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_every_data_cell_ran_and_waited_a_share_of_its_step(report):
    _, data = report
    cells = data["cells"]
    assert all("error" not in c for c in cells), [c for c in cells if "error" in c]
    assert {c["data"] for c in cells} == {"imagefolder", "lmdb"}
    for cell in cells:
        assert positive(cell["images_per_sec"]["median"]) and positive(cell["step_seconds"]["median"])
        assert cell["loader_workers"] == 1 and cell["device"] == "cpu"
        assert positive(cell["data_wait_seconds"]), cell
        assert 0 < cell["data_wait_share"] <= 1


def test_baselines_read_the_imagefolder_only(report):
    _, data = report
    runners = {(c["runner"], c["data"]) for c in data["cells"]}
    assert runners == {("hvdcls", "imagefolder"), ("hvdcls", "lmdb"), ("raw-horovod", "imagefolder"),
                       ("ddp", "imagefolder")}
    for cell in data["cells"]:
        if cell["runner"] == "hvdcls" and cell["data"] == "imagefolder":
            assert positive(cell["vs_raw_horovod"])
            assert positive(cell["horovod_vs_peer"]) or cell["backend"] == "tensorflow"
        if cell["runner"] == "hvdcls" and cell["data"] == "lmdb":
            assert cell["vs_raw_horovod"] is None and cell["horovod_vs_peer"] is None


def test_the_table_names_the_data_of_every_row(report):
    out, data = report
    table = (out / "bench.md").read_text()
    assert table.count("| imagefolder/1w |") + table.count("| lmdb/1w |") == len(data["cells"])
