"""`hvdcls bench --compile off on` without launching anything: the cells, the worker's config,
the ratios and the table (hvdcls.bench.matrix, worker, report)."""
import pytest

from hvdcls.bench import matrix as bench, report as bench_report, worker
from tests.unit.test_bench import raw


def test_each_compiled_cell_follows_its_plain_one_and_gets_no_baseline():
    spec = bench.BenchSpec(backends=["torch"], nps=[1, 2], compressions=["none"], batch_sizes=[16],
                           models=["m"], compiles=["off", "on"])
    cells = bench.cells(spec)
    hv = [(c.np, c.compile) for c in cells if c.runner == "hvdcls"]
    assert hv == [(1, "off"), (1, "on"), (2, "off"), (2, "on")]  # side by side in every round
    assert all(c.compile == "off" for c in cells if c.runner != "hvdcls")
    assert len([c for c in cells if c.runner != "hvdcls"]) == 4  # raw Horovod and DDP, np 1 and 2
    on = next(c for c in cells if c.compile == "on")
    launch = bench.command(on, spec, bench.Path("out.json"))
    assert launch[launch.index("--compile") + 1] == "on"
    assert bench.Cell.of({**vars(on), "error": "x"}) == on


def test_the_worker_turns_the_flag_into_training_compile():
    for flag, value in (("on", True), ("off", False)):
        args = worker.parse(["--backend", "torch", "--out", "o.json", "--compile", flag])
        assert worker.cell_config(args).training.compile is value


def test_vs_compile_off_and_scaling_compare_like_with_like():
    specs = [(1, "off", 100.0), (1, "on", 150.0), (2, "off", 160.0), (2, "on", 270.0)]
    results = [bench.summarise(bench.Cell("hvdcls", "torch", n, "none", 16, "m", compile=c),
                               {**raw([v]), "first_step_seconds": 20.0 if c == "on" else 0.5})
               for n, c, v in specs]
    bench.add_ratios(results)
    by = {(r["np"], r["compile"]): r for r in results}
    assert by[(1, "on")]["vs_compile_off"] == pytest.approx(1.5)
    assert by[(2, "on")]["vs_compile_off"] == pytest.approx(270.0 / 160.0)
    assert by[(2, "on")]["scaling_efficiency"] == pytest.approx(270.0 / 300.0)  # against np=1 compiled
    assert by[(2, "off")]["vs_compile_off"] is None
    row = dict(zip(bench_report.COLUMNS, bench_report.row(by[(2, "on")])))
    assert row["compile"] == "on" and row["1st step s"] == "20.0" and row["vs compile off"] == "1.69"
