"""horovod.wait and `hvdcls bench --wait sleep spin` without launching anything: the sleeping
wait's polling, the cells, the worker's config, the ratios and the table."""
import pytest

from hvdcls import horovod_backend
from hvdcls.bench import matrix as bench
from hvdcls.bench import report as bench_report
from hvdcls.bench import worker
from tests.unit.test_bench import raw


def test_the_sleeping_wait_naps_between_polls_until_every_handle_is_done(monkeypatch):
    naps, polls = [], []
    pending = {7: 3, 8: 0, 9: 1}  # handle -> polls that still answer "not done"

    def poll(handle):
        polls.append(handle)
        if pending[handle]:
            pending[handle] -= 1
            return False
        return True

    monkeypatch.setattr(horovod_backend.time, "sleep", naps.append)
    horovod_backend.sleep_until_done([7, 8, 9], poll)
    assert polls == [7, 7, 7, 7, 8, 9, 9]  # in order, each until done, none polled after
    assert naps == [horovod_backend.WAIT_NAP_SECONDS] * 4  # one nap per "not done", no spin
    assert not any(pending.values())


def test_auto_sleeps_only_for_gradients_over_16_mb():
    big, small = horovod_backend.AUTO_SLEEP_ABOVE_BYTES + 1, 300_000  # ResNet-18 is 45 MB
    assert horovod_backend.waits_asleep("auto", big) and not horovod_backend.waits_asleep("auto", small)
    assert horovod_backend.waits_asleep("sleep", small) and not horovod_backend.waits_asleep("spin", big)
    assert not horovod_backend.waits_asleep("auto", horovod_backend.AUTO_SLEEP_ABOVE_BYTES)


def test_each_torch_cell_is_measured_both_ways_beside_one_set_of_baselines():
    spec = bench.BenchSpec(backends=["torch", "tensorflow"], nps=[2], compressions=["none"],
                           batch_sizes=[16], models=["m"], waits=["auto", "spin"])
    cells = bench.cells(spec)
    hv = [(c.backend, c.wait) for c in cells if c.runner == "hvdcls"]
    assert hv == [("torch", "auto"), ("torch", "spin"), ("tensorflow", "auto")]  # TF waits in TF
    baselines = [(c.runner, c.backend, c.wait) for c in cells if c.runner != "hvdcls"]
    assert sorted(baselines) == [("ddp", "torch", "auto"), ("mwms", "tensorflow", "auto"),
                                 ("raw-horovod", "tensorflow", "auto"), ("raw-horovod", "torch", "auto")]
    spin = next(c for c in cells if c.wait == "spin")
    launch = bench.command(spin, spec, bench.Path("out.json"))
    assert launch[launch.index("--wait") + 1] == "spin"
    assert bench.Cell.of({**vars(spin), "error": "x"}) == spin
    assert bench.BenchSpec().waits == ["auto"]  # the default bench measures the default only


def test_the_worker_turns_the_flag_into_horovod_wait():
    for flag in ("auto", "sleep", "spin"):
        args = worker.parse(["--backend", "torch", "--out", "o.json", "--wait", flag])
        assert worker.cell_config(args).horovod.wait == flag
    assert worker.cell_config(worker.parse(["--backend", "torch", "--out", "o.json"])).horovod.wait == "auto"


def test_both_waits_are_compared_with_the_same_baselines_and_with_each_other():
    cell = bench.Cell("hvdcls", "torch", 2, "none", 16, "m")
    results = [bench.summarise(c, raw([v])) for c, v in (
        (cell, 110.0), (bench.replace(cell, wait="spin"), 100.0),
        (bench.replace(cell, runner="raw-horovod"), 98.0), (bench.replace(cell, runner="ddp"), 105.0))]
    bench.add_ratios(results)
    sleep, spin, raw_horovod, ddp = results
    assert sleep["vs_wait_spin"] == pytest.approx(1.1) and spin["vs_wait_spin"] is None
    assert sleep["horovod_vs_peer"] == pytest.approx(110 / 105)
    assert spin["horovod_vs_peer"] == pytest.approx(100 / 105)  # the spin cell finds DDP too
    assert spin["vs_raw_horovod"] == pytest.approx(100 / 98)
    assert raw_horovod["vs_wait_spin"] is None and ddp["vs_wait_spin"] is None
    rows = {r["wait"] + r["runner"]: dict(zip(bench_report.COLUMNS, bench_report.row(r))) for r in results}
    assert rows["autohvdcls"]["wait"] == "auto" and rows["autohvdcls"]["vs wait spin"] == "1.10"
    assert rows["spinhvdcls"]["wait"] == "spin" and rows["autoddp"]["wait"] == "-"
