"""`hvdcls bench --tensor 1 2` without launching anything: the cells, the worker's flags and
config, its images per second per replica, the table's columns and ratios, a refused cell's
line, and the values and settings refused before a launch (hvdcls.bench.matrix, tensor,
worker, report)."""
import subprocess
import types

import pytest

from hvdcls import cli
from hvdcls.backend import Backend
from hvdcls.bench import matrix as bench
from hvdcls.bench import report as bench_report
from hvdcls.bench import worker
from hvdcls.errors import UserError
from tests.unit.test_bench import raw

MB = 1_000_000


def spec(**change):
    return bench.BenchSpec(**{"backends": ["torch"], "nps": [1, 2], "compressions": ["none"],
                              "batch_sizes": [8], "models": ["vit_b_16"], "tensors": [1, 2], **change})


def test_each_t_follows_its_t_1_cell_where_t_divides_np_and_only_t_1_gets_baselines():
    cells = bench.cells(spec())
    hv = [(c.np, c.tensor) for c in cells if c.runner == "hvdcls"]
    assert hv == [(1, 1), (2, 1), (2, 2)]  # np=1 has no T=2 cell
    assert all(c.tensor == 1 for c in cells if c.runner != "hvdcls")
    assert {(c.runner, c.np) for c in cells if c.runner != "hvdcls"} == {
        ("raw-horovod", 1), ("raw-horovod", 2), ("ddp", 1), ("ddp", 2)}
    assert len({c.file_name() for c in cells}) == len(cells)
    split = next(c for c in cells if c.tensor == 2)
    launch = bench.command(split, spec(), bench.Path("out.json"))
    assert launch[launch.index("--tensor") + 1] == "2" and launch[0].endswith("horovodrun")
    assert bench.Cell.of({**vars(split), "error": "x"}) == split
    assert bench.Cell.of({k: v for k, v in vars(split).items() if k != "tensor"}).tensor == 1  # old reports
    assert [c.tensor for c in bench.cells(spec(nps=[2, 3, 4], tensors=[2]))] == [2, 2]  # np=3: none
    assert bench.BenchSpec().tensors == [1]  # the default matrix is unchanged


def test_the_worker_turns_the_flag_into_parallel_tensor_and_counts_each_replica_once():
    args = worker.parse(["--backend", "torch", "--out", "o.json", "--model", "vit_b_16", "--tensor", "2",
                         "--batch-size", "8", "--steps", "2"])
    assert worker.cell_config(args).parallel.tensor == 2
    assert worker.cell_config(worker.parse(["--backend", "torch", "--out", "o.json"])).parallel.tensor == 1
    ctx = types.SimpleNamespace(size=4, threads=1, versions={})
    reps = [(worker.Timed(1.0, None, 0.25), None), (worker.Timed(2.0, None, None), None)]
    out = worker.result(args, ctx, {"parameters": 10}, {}, reps,
                        {"bytes_per_step": 0, "tensor_parallel_bytes_per_step": 123})
    assert out["images_per_sec"] == [8 * 2 / 0.5, 8 * 2 / 1.0]  # 4 ranks: 2 replicas of 2
    assert out["tensor_parallel_seconds"] == [0.125, None] and out["tensor_parallel_bytes_per_step"] == 123
    assert worker.total([0.5, 0.25]) == 0.75 and worker.total([0.5, None]) is None


class Counting:
    """A backend's step and communication as timed_steps and saved_activation_bytes see them."""

    def __init__(self, tensor_seconds):
        self.tensor_seconds, self.steps = tensor_seconds, 0

    def train_step(self, batches, lr, weight):
        self.steps += 1
        return types.SimpleNamespace(loss=1.0)

    def allreduce_wait_seconds(self):
        return 0.01

    def communication(self):
        return None if self.tensor_seconds is None else {"tensor_parallel_seconds_per_step": self.tensor_seconds}


def test_timed_steps_sum_the_tensor_groups_seconds_and_a_backend_without_counts_gives_none():
    feed = worker.Feed(iter([("x", "y")] * 6))
    timed = worker.timed_steps(Counting(0.5), feed, 3)
    assert timed.allreduce == pytest.approx(0.03) and timed.tensor == 1.5
    assert worker.timed_steps(Counting(None), feed, 3).tensor is None
    plain = Counting(None)
    assert Backend.saved_activation_bytes(plain, lambda: plain.train_step([], 0, 1)) is None and plain.steps == 1


def measured():
    """ViT-B/16-like cells: T=2 halves the blocks' weights (the rest whole) and most activations."""
    rows = [(1, 1, 10.0, 344 * MB, 40 * MB, None), (2, 1, 17.0, 344 * MB, 40 * MB, None),
            (2, 2, 8.5, 174 * MB, 22 * MB, ([0.02, 0.03, 0.025], 9 * MB))]
    results = []
    for n, t, v, params, acts, group in rows:
        seconds, sent = group or (None, None)
        extra = {"memory": {"param_bytes": params}, "activation_bytes": acts, "replicas": n // t,
                 "tensor_parallel_bytes_per_step": sent, "tensor_parallel_seconds": seconds}
        results.append(bench.summarise(bench.Cell("hvdcls", "torch", n, "none", 8, "vit_b_16", tensor=t),
                                       {**raw([v, v, v]), **extra}))
    results.append(bench.summarise(bench.Cell("raw-horovod", "torch", 2, "none", 8, "vit_b_16"), raw([18.0])))
    bench.add_ratios(results)
    return {(r["runner"], r["np"], r["tensor"]): r for r in results}


def test_a_t_2_cell_against_its_t_1_twin_and_one_rank_at_t_1():
    by = measured()
    split = by[("hvdcls", 2, 2)]
    assert split["vs_tensor_1"] == pytest.approx(8.5 / 17.0)
    assert split["param_vs_tensor_1"] == pytest.approx(174 / 344) and split["activation_vs_tensor_1"] == 0.55
    assert split["scaling_efficiency"] == pytest.approx(8.5 / (2 * 10.0))  # against np=1 at T=1
    assert split["tensor_parallel_seconds"] == 0.025
    assert split["tensor_parallel_share"] == pytest.approx(0.025 / (16 / 8.5))
    assert split["vs_raw_horovod"] is None  # raw Horovod has no tensor split: no like-for-like
    plain = by[("hvdcls", 2, 1)]
    assert plain["vs_tensor_1"] is None and plain["tensor_parallel_share"] is None
    assert plain["vs_raw_horovod"] == pytest.approx(17.0 / 18.0)


def test_the_table_shows_t_the_groups_traffic_and_the_memory_ratios():
    by = measured()
    row = dict(zip(bench_report.COLUMNS, bench_report.row(by[("hvdcls", 2, 2)])))
    assert row["tensor"] == "2" and row["vs tensor 1"] == "0.50" and row["TP MB/step"] == "9.00"
    assert row["TP share"] == "1%" and row["act MB"] == "22.0" and row["param MB"] == "174.000"
    assert row["param vs T=1"] == "0.506" and row["act vs T=1"] == "0.550"
    baseline = dict(zip(bench_report.COLUMNS, bench_report.row(by[("raw-horovod", 2, 1)])))
    assert baseline["tensor"] == "1" and baseline["act MB"] == "-" and baseline["TP share"] == "-"
    assert all(len(bench_report.row(r)) == len(bench_report.COLUMNS) for r in by.values())
    old = {k: v for k, v in by[("hvdcls", 2, 1)].items() if k != "tensor"}  # an older report
    assert dict(zip(bench_report.COLUMNS, bench_report.row(old)))["tensor"] == "1"
    failed = {**vars(bench.Cell("hvdcls", "tensorflow", 2, "none", 8, "vit_b_16", tensor=2)), "error": "x"}
    assert dict(zip(bench_report.COLUMNS, bench_report.row(failed)))["tensor"] == "2"


def test_a_refused_cell_reports_the_workers_one_line(capsys):
    assert worker.run(["--backend", "torch", "--out", "o.json", "--model", "resnet50", "--tensor", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(worker.REFUSED) and "parallel.tensor=2" in err[0]
    said = "[1,0]<stderr>:" + err[0]  # as horovodrun prefixes a rank's line
    launch = subprocess.CompletedProcess([], 2, "noise\n" + said + "\n", said + "\nmore noise\n")
    assert bench.failure(launch) == "exit 2: " + err[0][len(worker.REFUSED):]
    assert bench.failure(subprocess.CompletedProcess([], 1, "a\nb", "")) == "exit 1: a | b"
    baseline = "[0]<stderr>:bench baseline: error: keras.applications has no model 'vit_b_16'"  # benchmarks/tf_step.py
    assert bench.failure(subprocess.CompletedProcess([], 2, "", "noise\n" + baseline)) == \
        "exit 2: keras.applications has no model 'vit_b_16'"


@pytest.mark.parametrize("change, words", [
    ({"tensors": [0, 1]}, "--tensor 0: must be at least 1"),
    ({"tensors": [4], "nps": [1, 2]}, "--tensor 4: no --np"),
    ({"models": ["resnet50"]}, "--tensor 2 .*splits the ViTs"),
    ({"models": ["vit_b_16"], "tensors": [8], "nps": [8]}, "does not divide vit_b_16's 12"),
    ({"compressions": ["none", "powersgd"]}, "powersgd"),
    ({"zeros": [0, 3]}, "training.zero=3"),
    ({"balances": ["off", "dynamic"]}, "training.balance=dynamic")])
def test_what_parallel_tensor_refuses_is_refused_before_a_launch(change, words):
    with pytest.raises(UserError, match=words) as error:
        bench.validate(spec(**change))
    assert "\n" not in str(error.value) and str(error.value).startswith("--tensor ")


def test_what_parallel_tensor_serves_passes_and_tensorflow_is_left_to_its_launch():
    bench.validate(spec(models=["vit_b_16", "vit_l_16"], compressions=["none", "fp16"]))
    bench.validate(spec(backends=["torch", "tensorflow"]))  # TensorFlow's refusal is its cell's row
    bench.validate(spec(zeros=[0, 1], tensors=[1]))
    bench.validate(spec(zeros=[0, 1, 2]))  # ZeRO 1 and 2 shard over the replicas


def test_the_cli_refuses_a_cnn_at_t_2_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bench", "--tensor", "1", "2", "--np", "2", "--backends", "torch", "--model", "resnet50",
                     "--no-baselines", "--output-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tensor 2" in err[0] and "resnet50" in err[0], err
    assert not out.exists()  # nothing launched, nothing written
