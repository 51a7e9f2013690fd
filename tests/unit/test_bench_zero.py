"""`hvdcls bench --zero 0 1 2` without launching anything: the cells, the worker's config, the
memory columns and their ratios, and the settings training.zero refuses (hvdcls.bench.matrix,
sharding, worker, report)."""
import pytest

from hvdcls import cli
from hvdcls.bench import matrix as bench
from hvdcls.bench import report as bench_report
from hvdcls.bench import worker
from hvdcls.errors import UserError
from tests.unit.test_bench import raw

PARAMS = 4000  # bytes of float32 weights in the cells below


def spec(**change):
    return bench.BenchSpec(**{"backends": ["torch"], "nps": [1, 2], "compressions": ["none"],
                              "batch_sizes": [16], "models": ["m"], **change})


def test_each_level_follows_its_zero_0_cell_and_only_zero_0_gets_baselines():
    cells = bench.cells(spec(zeros=[0, 1, 2]))
    hv = [(c.np, c.zero) for c in cells if c.runner == "hvdcls"]
    assert hv == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]  # side by side in every round
    assert all(c.zero == 0 for c in cells if c.runner != "hvdcls")
    assert len([c for c in cells if c.runner != "hvdcls"]) == 4  # raw Horovod and DDP, np 1 and 2
    assert len({c.file_name() for c in cells}) == len(cells)
    sharded = next(c for c in cells if c.zero == 2 and c.np == 2)
    launch = bench.command(sharded, spec(), bench.Path("out.json"))
    assert launch[launch.index("--zero") + 1] == "2" and launch[0].endswith("horovodrun")
    assert bench.Cell.of({**vars(sharded), "error": "x"}) == sharded
    assert bench.Cell.of({k: v for k, v in vars(sharded).items() if k != "zero"}).zero == 0  # old reports


def test_the_default_matrix_is_unchanged():
    assert bench.BenchSpec().zeros == [0]
    assert [c.zero for c in bench.cells(spec())] == [0] * len(bench.cells(spec()))
    plain = bench.command(bench.cells(spec())[0], spec(), bench.Path("out.json"))
    assert plain[plain.index("--zero") + 1] == "0"


def test_the_worker_turns_the_flag_into_training_zero():
    for level in (0, 1, 2):
        args = worker.parse(["--backend", "torch", "--out", "o.json", "--zero", str(level)])
        assert worker.cell_config(args).training.zero == level


def test_activation_checkpointing_reaches_every_hvdcls_cell_and_no_baseline():
    on = spec(zeros=[2, 3], activation_checkpointing=True)
    for cell in bench.cells(on):
        launch = bench.command(cell, on, bench.Path("out.json"))
        assert ("--activation-checkpointing" in launch) == (cell.runner == "hvdcls"), launch
    assert not any("--activation-checkpointing" in bench.command(c, spec(), bench.Path("o.json"))
                   for c in bench.cells(spec()))  # off by default
    args = worker.parse(["--backend", "torch", "--out", "o.json", "--activation-checkpointing"])
    assert worker.cell_config(args).training.activation_checkpointing is True
    default = worker.parse(["--backend", "torch", "--out", "o.json"])
    assert worker.cell_config(default).training.activation_checkpointing is False


def memory(opt, grad):
    return {"param_bytes": PARAMS, "grad_bytes": grad, "optimizer_state_bytes": opt,
            "peak_rss_bytes": 300_000_000}


def measured():
    """SGD with momentum (the bench's optimizer): state = weights at zero 0, halved per rank by
    zero 1 at np=2 (plus a pad to a multiple of the world size), gradients too by zero 2; zero 1
    holds the local gradients and the averaged slice (as the backends count them)."""
    rows = [(1, 0, 100.0, memory(PARAMS, PARAMS)), (1, 1, 98.0, memory(PARAMS, 2 * PARAMS)),
            (1, 2, 97.0, memory(PARAMS, PARAMS)), (2, 0, 160.0, memory(PARAMS, PARAMS)),
            (2, 1, 150.0, memory(2004, PARAMS + 2004)), (2, 2, 140.0, memory(2004, 2004))]
    results = [bench.summarise(bench.Cell("hvdcls", "torch", n, "none", 16, "m", zero=z),
                               {**raw([v]), "memory": mem, "rank_memory": [mem] * n})
               for n, z, v, mem in rows]
    results.append(bench.summarise(bench.Cell("raw-horovod", "torch", 2, "none", 16, "m"), raw([170.0])))
    bench.add_ratios(results)
    return {(r["runner"], r["np"], r["zero"]): r for r in results}


def test_sharded_bytes_against_np_1_and_zero_0_and_the_speed_against_zero_0():
    by = measured()
    one = by[("hvdcls", 2, 1)]
    assert one["memory_vs_np_1"] == {"optimizer_state_bytes": 2004 / PARAMS, "grad_bytes": 6004 / 8000}
    assert one["memory_vs_zero_0"] == {"optimizer_state_bytes": 2004 / PARAMS, "grad_bytes": 6004 / 4000}
    assert one["vs_zero_0"] == pytest.approx(150.0 / 160.0)
    assert one["scaling_efficiency"] == pytest.approx(150.0 / (2 * 98.0))  # against np=1 at zero 1
    assert one["vs_raw_horovod"] is None  # raw Horovod has no sharding: no like-for-like
    two = by[("hvdcls", 2, 2)]
    assert two["memory_vs_np_1"]["grad_bytes"] == pytest.approx(0.501)
    assert by[("hvdcls", 2, 0)]["memory_vs_np_1"] == {"optimizer_state_bytes": 1.0, "grad_bytes": 1.0}
    assert by[("hvdcls", 2, 0)]["vs_zero_0"] is None and by[("hvdcls", 2, 0)]["memory_vs_zero_0"] is None
    assert by[("hvdcls", 1, 1)]["memory_vs_np_1"] is None  # np=1 is the base
    assert by[("hvdcls", 2, 0)]["vs_raw_horovod"] == pytest.approx(160.0 / 170.0)
    assert by[("raw-horovod", 2, 0)]["memory"] is None and by[("raw-horovod", 2, 0)]["memory_vs_np_1"] is None
    assert by[("hvdcls", 2, 2)]["rank_memory"] == [memory(2004, 2004)] * 2


def test_the_table_shows_the_level_the_bytes_and_the_ratios():
    by = measured()
    row = dict(zip(bench_report.COLUMNS, bench_report.row(by[("hvdcls", 2, 2)])))
    assert row["zero"] == "2" and row["vs zero 0"] == "0.88"
    assert row["param MB"] == "0.004" and row["grad MB"] == "0.002" and row["opt state MB"] == "0.002"
    assert row["peak RSS MB"] == "300"
    assert row["opt state vs np=1"] == "0.501" and row["grad vs np=1"] == "0.501"
    baseline = dict(zip(bench_report.COLUMNS, bench_report.row(by[("raw-horovod", 2, 0)])))
    assert baseline["zero"] == "0" and baseline["param MB"] == "-" and baseline["opt state vs np=1"] == "-"
    assert len(bench_report.row(by[("hvdcls", 1, 0)])) == len(bench_report.COLUMNS)
    old = {k: v for k, v in by[("hvdcls", 2, 0)].items() if k not in ("zero", "memory")}  # older report
    assert dict(zip(bench_report.COLUMNS, bench_report.row(old)))["zero"] == "0"


@pytest.mark.parametrize("change, words", [
    ({"zeros": [0, 1], "compressions": ["none", "powersgd"]}, "powersgd"),
    ({"zeros": [2], "device": "cuda"}, "float16"),
    ({"zeros": [4]}, "--zero 4: use 0 1 2 3")])
def test_what_training_zero_refuses_is_refused_before_a_launch(change, words):
    with pytest.raises(UserError, match=words) as error:
        bench.validate(spec(**change))
    assert "\n" not in str(error.value) and str(error.value).startswith("--zero ")


def test_what_training_zero_serves_passes():
    bench.validate(spec(zeros=[0, 1, 2], compressions=["none", "fp16"], balances=["off", "dynamic"]))
    bench.validate(spec(nps=[1], zeros=[1], compressions=["none", "powersgd"]))  # np=1: uncompressed
    bench.validate(spec(zeros=[0], compressions=["none", "powersgd"]))


def test_the_cli_refuses_zero_with_powersgd_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["bench", "--zero", "0", "1", "--np", "2", "--compression", "powersgd",
                     "--no-baselines", "--output-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--zero 1" in err[0] and "powersgd" in err[0], err
    assert not out.exists()  # nothing launched, nothing written
