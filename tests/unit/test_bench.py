"""hvdcls.bench.matrix's pure parts: the matrix, the summary of a cell and the ratios between runners."""
import pytest

from hvdcls.bench import matrix as bench
from hvdcls.bench import report as bench_report
from hvdcls.errors import UserError


def raw(images_per_sec, parameters=1000, waits=None):
    steps = [16 / v for v in images_per_sec]
    return {"threads": 1, "parameters": parameters, "images_per_sec": images_per_sec,
            "step_seconds": steps, "allreduce_wait_seconds": waits or [None] * len(steps)}


def test_the_matrix_and_its_matching_baselines():
    spec = bench.BenchSpec(backends=["torch", "tensorflow"], nps=[1, 2], compressions=["none"],
                           batch_sizes=[16], models=["resnet50"])
    cells = bench.cells(spec)
    hv = [c for c in cells if c.runner == "hvdcls"]
    assert len(hv) == 4
    assert {(c.runner, c.backend) for c in cells} == {
        ("hvdcls", "torch"), ("hvdcls", "tensorflow"), ("raw-horovod", "torch"),
        ("raw-horovod", "tensorflow"), ("ddp", "torch"), ("mwms", "tensorflow")}
    assert len(cells) == 4 + 4 + 2 + 2  # each backend's own peer: DDP for torch, MWMS for TF
    spec.baseline_runners = ["ddp"]
    assert {c.runner for c in bench.cells(spec)} == {"hvdcls", "ddp"}
    spec.baselines = False
    assert all(c.runner == "hvdcls" for c in bench.cells(spec))


def test_bytes_follow_compression_and_the_ring():
    one = bench.summarise(bench.Cell("hvdcls", "torch", 4, "fp16", 16, "m"), raw([100.0], 1000))
    assert one["allreduce_bytes_per_step"] == 2000
    assert one["ring_bytes_sent_per_rank"] == 3000  # 2 (N-1)/N of the buffer
    alone = bench.summarise(bench.Cell("hvdcls", "torch", 1, "none", 16, "m"), raw([100.0], 1000))
    assert alone["allreduce_bytes_per_step"] == 0 and alone["ring_bytes_sent_per_rank"] == 0


def test_median_spread_and_communication_share():
    cell = bench.summarise(bench.Cell("hvdcls", "torch", 2, "none", 16, "m"),
                           raw([100.0, 80.0, 160.0], waits=[0.05, 0.05, 0.05]))
    assert cell["images_per_sec"] == {"median": 100.0, "min": 80.0, "max": 160.0}
    assert cell["images_per_sec_per_worker"] == 50.0
    assert abs(cell["communication_share"] - 0.05 / 0.16) < 1e-9


def test_ratios_compare_like_with_like():
    results = [bench.summarise(bench.Cell(r, "torch", n, "none", 16, "m"), raw([v]))
               for r, n, v in [("hvdcls", 1, 100.0), ("hvdcls", 2, 150.0), ("raw-horovod", 2, 160.0),
                               ("ddp", 2, 200.0), ("raw-horovod", 1, 100.0)]]
    bench.add_ratios(results)
    by = {(r["runner"], r["np"]): r for r in results}
    assert by[("hvdcls", 2)]["scaling_efficiency"] == 0.75
    assert by[("hvdcls", 2)]["vs_raw_horovod"] == 150.0 / 160.0
    assert by[("raw-horovod", 2)]["horovod_vs_peer"] == 0.8
    assert by[("ddp", 2)]["vs_raw_horovod"] is None and by[("ddp", 2)]["horovod_vs_peer"] is None


def test_a_failed_cell_is_a_row_not_a_crash():
    report = {"machine": {"hostname": "h", "cpu": "c", "usable_cores": 2, "python": "3.11",
                          "versions": {}},
              "spec": vars(bench.BenchSpec()),
              "cells": [{"runner": "ddp", "backend": "torch", "np": 2, "compression": "none",
                         "batch_size": 16, "model": "m", "error": "exit 1: boom"}]}
    text = bench_report.markdown(report)
    assert "failed: exit 1: boom" in text
    assert text.count("\n| ") == 2  # header + one row


def test_one_process_runs_uncompressed_and_powersgd_has_only_a_ddp_baseline():
    spec = bench.BenchSpec(backends=["torch"], nps=[1, 2], compressions=["fp16", "powersgd"],
                           batch_sizes=[16], models=["m"])
    cells = bench.cells(spec)
    assert {(c.runner, c.np, c.compression) for c in cells} == {
        ("hvdcls", 1, "none"), ("hvdcls", 2, "fp16"), ("hvdcls", 2, "powersgd"),
        ("raw-horovod", 1, "none"), ("raw-horovod", 2, "fp16"),
        ("ddp", 1, "none"), ("ddp", 2, "fp16"), ("ddp", 2, "powersgd")}
    assert len(cells) == len(set(cells))


def test_float16_factors_go_to_hvdcls_powersgd_cells_only():
    from hvdcls.bench import worker

    spec = bench.BenchSpec(backends=["torch"], nps=[2], compressions=["fp16", "powersgd"],
                           batch_sizes=[16], models=["m"], powersgd_fp16=True)
    launches = {(c.runner, c.compression): bench.command(c, spec, bench.Path("o.json")) for c in bench.cells(spec)}
    flagged = {key for key, launch in launches.items() if "--powersgd-fp16" in launch}
    assert flagged == {("hvdcls", "powersgd")}  # not hvdcls's fp16 cell, not DDP's hook
    args = worker.parse(["--backend", "torch", "--out", "o.json", "--compression", "powersgd", "--powersgd-fp16"])
    assert worker.cell_config(args).horovod.powersgd.fp16
    assert not worker.cell_config(worker.parse(["--backend", "torch", "--out", "o.json"])).horovod.powersgd.fp16


def test_compressed_cells_scale_against_the_uncompressed_single_process():
    results = [bench.summarise(bench.Cell("hvdcls", "torch", n, c, 16, "m"), raw([v]))
               for n, c, v in [(1, "none", 100.0), (2, "fp16", 180.0), (2, "powersgd", 190.0)]]
    bench.add_ratios(results)
    assert [r["scaling_efficiency"] for r in results] == [1.0, 0.9, 0.95]


def test_counted_bytes_win_over_the_parameter_estimate():
    counted = bench.summarise(bench.Cell("hvdcls", "torch", 2, "powersgd", 16, "m"),
                              {**raw([100.0], 1000), "allreduce_bytes_per_step": 120})
    assert counted["allreduce_bytes_per_step"] == 120 and counted["ring_bytes_sent_per_rank"] == 120
    unknown = bench.summarise(bench.Cell("ddp", "torch", 2, "powersgd", 16, "m"), raw([100.0], 1000))
    assert unknown["allreduce_bytes_per_step"] is None and unknown["ring_bytes_sent_per_rank"] is None
    shown = bench_report.row({**unknown, "scaling_efficiency": 1.0, "vs_raw_horovod": None,
                              "horovod_vs_peer": None})
    assert shown[bench_report.COLUMNS.index("MB/step")] == "-"


def test_rounds_pool_their_repetitions():
    merged = bench.merge_rounds([raw([100.0, 110.0]), raw([90.0])])
    assert merged["images_per_sec"] == [100.0, 110.0, 90.0]
    assert len(merged["step_seconds"]) == len(merged["allreduce_wait_seconds"]) == 3
    cell = bench.summarise(bench.Cell("hvdcls", "torch", 2, "none", 16, "m"), merged)
    assert cell["images_per_sec"] == {"median": 100.0, "min": 90.0, "max": 110.0}


def test_the_sweep_grid_starts_with_the_bench_settings_once():
    spec = bench.BenchSpec(fusion_threshold_mb=32.0, cycle_time_ms=5.0, sweep_fusion_mb=[0.0, 32.0],
                           sweep_cycle_ms=[1.0, 5.0])
    assert bench.sweep_settings(spec) == [(32.0, 5.0), (0.0, 1.0), (0.0, 5.0), (32.0, 1.0)]


def test_gradient_sweep_table_is_fastest_first_with_failures_last():
    rows = [{"fusion_mb": f, "cycle_ms": 5.0, "model": "m", "tensors": 3, "bytes": 4_000_000,
             "seconds": s, "bus_gbit_per_s": 1.0, "share_of_link": 0.5} for f, s in [(0.0, 2.0), (32.0, 1.0)]]
    lines = bench_report.gradient_lines(rows + [{"fusion_mb": 4.0, "cycle_ms": 1.0, "error": "boom"}])
    body = [line for line in lines if line.startswith("| ") and "fusion MB" not in line]
    assert body[0].startswith("| 32 | 5 | 1.0000") and body[0].endswith("| 1.00 |")
    assert body[1].startswith("| 0 | 5 | 2.0000") and body[1].endswith("| 0.50 |")
    assert "failed: boom" in body[2]


@pytest.mark.parametrize("change, flag", [({"nps": [0]}, "--np"), ({"rounds": 0}, "--rounds"),
                                          ({"compressions": ["gzip"]}, "--compression"),
                                          ({"cycle_time_ms": 0}, "--cycle-time-ms"),
                                          ({"loader_workers": -1}, "--loader-workers"),
                                          ({"sweep_fusion_mb": [32.0, -1.0]}, "--sweep-fusion-mb"),
                                          ({"sweep_cycle_ms": [0.0]}, "--sweep-cycle-ms")])
def test_bad_flags_are_one_line_errors(change, flag):
    with pytest.raises(UserError, match=flag):
        bench.validate(bench.BenchSpec(**change))


def test_a_backend_without_its_horovod_binding_is_one_line_before_any_launch(monkeypatch):
    """As on the GPU host whose Horovod did not build: not one traceback per cell."""
    from hvdcls import registry

    real_find_spec = registry.importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name: None if name == "horovod" else real_find_spec(name))
    with pytest.raises(UserError, match=r"backend 'torch' needs horovod.torch, which is not installed"):
        bench.validate(bench.BenchSpec(backends=["torch"]))


def test_data_is_a_dimension_and_lmdb_has_no_baselines():
    spec = bench.BenchSpec(backends=["torch", "tensorflow"], nps=[1, 2], compressions=["none"],
                           data=["memory", "imagefolder", "lmdb"])
    cells = bench.cells(spec)
    assert len([c for c in cells if c.runner == "hvdcls"]) == 2 * 2 * 3
    assert {c.data for c in cells if c.runner != "hvdcls"} == {"memory", "imagefolder"}
    assert len([c for c in cells if c.runner != "hvdcls"]) == 2 * (2 + 2 + 2 + 2)
    assert bench.Cell("hvdcls", "torch", 1, "none", 16, "m").data == "memory"


def test_worker_args_carry_the_data_set_and_the_device(tmp_path):
    spec = bench.BenchSpec(loader_workers=3, device="cuda")
    out = tmp_path / "cell.json"
    memory = bench.worker_args(bench.Cell("hvdcls", "torch", 1, "none", 16, "m"), spec, out)
    assert "--data" not in memory and memory[memory.index("--device") + 1] == "cuda"
    lmdb = bench.worker_args(bench.Cell("hvdcls", "torch", 1, "none", 16, "m", "lmdb"), spec, out)
    assert lmdb[lmdb.index("--data") + 1] == "lmdb"
    assert lmdb[lmdb.index("--data-path") + 1] == str(tmp_path / "data" / "bench.lmdb")
    assert lmdb[lmdb.index("--loader-workers") + 1] == "3"
    folder = bench.worker_args(bench.Cell("ddp", "torch", 2, "none", 16, "m", "imagefolder"), spec, out)
    assert folder[folder.index("--data-path") + 1] == str(tmp_path / "data" / "imagefolder")


def test_data_wait_is_summarised_only_where_data_is_read():
    with_data = {**raw([100.0, 80.0, 160.0]), "data_wait_seconds": [0.04, 0.02, 0.08],
                 "loader_workers": 2}
    cell = bench.summarise(bench.Cell("hvdcls", "torch", 1, "none", 16, "m", "imagefolder"), with_data)
    assert cell["data_wait_seconds"] == 0.04 and cell["loader_workers"] == 2
    assert abs(cell["data_wait_share"] - 0.04 / 0.16) < 1e-9
    memory = bench.summarise(bench.Cell("hvdcls", "torch", 1, "none", 16, "m"), raw([100.0]))
    assert memory["data_wait_seconds"] is None and memory["data_wait_share"] is None
    assert memory["data"] == "memory" and memory["loader_workers"] is None


def test_ratios_never_cross_data_modes():
    results = [bench.summarise(bench.Cell(r, "torch", n, "none", 16, "m", d), raw([v]))
               for r, n, d, v in [("hvdcls", 1, "memory", 100.0), ("hvdcls", 2, "imagefolder", 120.0),
                                  ("hvdcls", 1, "imagefolder", 80.0), ("raw-horovod", 2, "memory", 150.0),
                                  ("ddp", 2, "imagefolder", 200.0)]]
    bench.add_ratios(results)
    folder = next(r for r in results if r["runner"] == "hvdcls" and r["np"] == 2)
    assert folder["scaling_efficiency"] == 120.0 / (2 * 80.0)  # not against memory's 100
    assert folder["vs_raw_horovod"] is None  # the raw Horovod cell read memory
    assert folder["horovod_vs_peer"] == 120.0 / 200.0


def test_the_table_shows_data_and_its_wait():
    cells = [bench.summarise(bench.Cell("hvdcls", "torch", 1, "none", 16, "m", "lmdb"),
                             {**raw([100.0]), "data_wait_seconds": [0.08], "loader_workers": 2}),
             bench.summarise(bench.Cell("hvdcls", "torch", 1, "none", 16, "m"), raw([100.0]))]
    bench.add_ratios(cells)
    report = {"machine": {"hostname": "h", "cpu": "c", "usable_cores": 2, "python": "3.11",
                          "versions": {}}, "spec": vars(bench.BenchSpec()), "cells": cells}
    rows = [line for line in bench_report.markdown(report).splitlines() if line.startswith("| hvdcls")]
    header = bench_report.COLUMNS
    lmdb, memory = ([v.strip() for v in line.strip("|").split("|")] for line in rows)
    assert lmdb[header.index("data")] == "lmdb/2w" and lmdb[header.index("data wait")] == "50%"
    assert memory[header.index("data")] == "memory" and memory[header.index("data wait")] == "-"


def test_the_baseline_scripts_are_found_in_a_source_checkout():
    for script in bench.BASELINE_SCRIPTS.values():
        assert (bench.BASELINES_DIR / script).is_file(), script


def test_each_backend_is_compared_with_its_own_peer():
    results = [bench.summarise(bench.Cell(r, b, 2, "none", 16, "m"), raw([v]))
               for r, b, v in [("hvdcls", "torch", 150.0), ("ddp", "torch", 200.0),
                               ("hvdcls", "tensorflow", 120.0), ("mwms", "tensorflow", 100.0),
                               ("raw-horovod", "tensorflow", 125.0)]]
    bench.add_ratios(results)
    by = {(r["runner"], r["backend"]): r for r in results}
    assert by[("hvdcls", "torch")]["horovod_vs_peer"] == 0.75 and by[("hvdcls", "torch")]["peer"] == "ddp"
    assert by[("hvdcls", "tensorflow")]["horovod_vs_peer"] == 1.2
    assert by[("raw-horovod", "tensorflow")]["horovod_vs_peer"] == 1.25
    assert by[("mwms", "tensorflow")]["horovod_vs_peer"] is None


def test_mwms_has_no_compression_and_stays_on_one_machine():
    spec = bench.BenchSpec(backends=["tensorflow"], nps=[1, 2], compressions=["none", "fp16"])
    assert {(c.runner, c.np, c.compression) for c in bench.cells(spec) if c.runner == "mwms"} == {
        ("mwms", 1, "none"), ("mwms", 2, "none")}
    across = bench.BenchSpec(backends=["torch", "tensorflow"], nps=[1, 2],
                             compressions=["none", "fp16", "powersgd"], link_mbit=100)
    runners = {(c.runner, c.compression) for c in bench.cells(across) if c.np == 2}
    assert {("ddp", "none"), ("ddp", "fp16"), ("ddp", "powersgd")} <= runners  # DDP crosses the link
    assert not any(r == "mwms" for r, _ in runners)
    slow = bench.BenchSpec(backends=["torch"], nps=[2], slow_rank="1=0.5")
    assert {c.runner for c in bench.cells(slow)} == {"hvdcls", "raw-horovod"}


def test_peers_launch_on_this_machine_or_one_node_per_namespace_host(tmp_path):
    spec = bench.BenchSpec()
    out = tmp_path / "cell.json"
    ddp = bench.command(bench.Cell("ddp", "torch", 2, "none", 16, "m"), spec, out)
    assert ddp[0].endswith("torchrun") and "--standalone" in ddp and "--nproc_per_node=2" in ddp
    mwms = bench.command(bench.Cell("mwms", "tensorflow", 2, "none", 16, "m"), spec, out)
    assert mwms[1].endswith("mwms_tf.py") and mwms[-2:] == ["--workers", "2"]

    from hvdcls.bench.netns import Link, ShapedHosts

    hosts = ShapedHosts(Link(100))  # not entered: nothing is made, the command only
    across = bench.command(bench.Cell("ddp", "torch", 2, "powersgd", 16, "m"), spec, out, hosts)
    assert across[:2] == ["bash", "-c"]
    script = across[2]
    for rank, (ns, address) in enumerate(zip(hosts.namespaces, hosts.addresses)):
        assert f"ip netns exec {ns}" in script and f"hostname {address}" in script
        assert f"--node-rank={rank}" in script
    assert script.count(f"--master-addr={hosts.addresses[0]}") == 2
    assert script.count("GLOO_SOCKET_IFNAME=hvd0") == 2 and "pids+=($!)" in script
    alone = bench.command(bench.Cell("ddp", "torch", 1, "none", 16, "m"), spec, out, hosts)
    assert "--standalone" in alone  # np=1 stays on the machine


def test_all_or_first_failure_in_a_real_bash():
    """The shaped-link DDP cells' wrapper: 0 once all succeed, even when one ended long before
    the others (where `wait -n` answered 127 at random), else the first failure's status with
    the others stopped."""
    import subprocess
    import time

    from hvdcls.bench.netns import all_or_first_failure

    def status(*commands):
        started = time.monotonic()
        done = subprocess.run(["bash", "-c", all_or_first_failure(list(commands))], timeout=20)
        return done.returncode, time.monotonic() - started

    assert status(["true"], ["sleep", "0.3"])[0] == 0
    assert status(["sleep", "0.2"], ["true"], ["echo", "a b"])[0] == 0
    code, seconds = status(["bash", "-c", "sleep 0.2; exit 3"], ["sleep", "30"])
    assert code == 3 and seconds < 10  # the sleeper was stopped, not waited for


def test_best_compression_of_each_stack_and_the_one_bucket_note():
    cells = [bench.summarise(bench.Cell(r, "torch", 2, c, 16, "m"), {**raw([v]), **extra})
             for r, c, v, extra in [
                 ("hvdcls", "none", 4.0, {"allocator": "tcmalloc"}), ("hvdcls", "powersgd", 27.0, {}),
                 ("hvdcls", "fp16", 7.0, {}),
                 ("ddp", "none", 4.5, {}), ("ddp", "fp16", 8.0, {}),
                 ("ddp", "powersgd", 12.0, {"ddp": {"buckets": 1, "hook": "powerSGD_hook"}}),
                 ("raw-horovod", "none", 30.0, {})]]
    bench.add_ratios(cells)
    best = bench.peers.best_against_peers(cells)
    assert len(best) == 1
    assert best[0]["hvdcls_compression"] == "powersgd" and best[0]["peer_compression"] == "powersgd"
    assert best[0]["ratio"] == 27.0 / 12.0
    report = {"machine": {"hostname": "h", "cpu": "c", "usable_cores": 2, "python": "3.11",
                          "versions": {}}, "spec": vars(bench.BenchSpec()), "cells": cells,
              "best_vs_peer": best}
    text = bench_report.markdown(report)
    assert "| ddp | torch | 2 | powersgd (1 bucket) |" in text
    assert "| hvdcls | torch | 2 | powersgd |" in text
    assert "| torch | 2 | 16 | m | memory | powersgd | 27.0 | ddp powersgd | 12.0 | 2.25 |" in text
    assert "; hvdcls's ranks on tcmalloc (HVDCLS_ALLOCATOR)\n" in text  # the worker's word, in the header


def test_the_ratio_to_the_peer_is_also_given_round_by_round():
    cell = bench.Cell("hvdcls", "torch", 2, "none", 16, "m")
    ours = [{**raw([100.0, 104.0]), "outside": []}, {**raw([90.0]), "outside": []}, {**raw([99.0]), "outside": []}]
    theirs = [{**raw([100.0]), "outside": []}, {**raw([100.0]), "outside": []}, {**raw([100.0]), "outside": []}]
    results = [bench.summarise(cell, bench.merge_rounds(ours)),
               bench.summarise(bench.replace(cell, runner="ddp"), bench.merge_rounds(theirs))]
    bench.add_ratios(results)
    mine = results[0]
    assert mine["images_per_sec_by_round"] == [102.0, 90.0, 99.0]  # each round's median
    assert mine["horovod_vs_peer"] == pytest.approx(99.5 / 100.0)  # the median of every repetition
    assert mine["horovod_vs_peer_by_round"] == pytest.approx([1.02, 0.90, 0.99])
    assert dict(zip(bench_report.COLUMNS, bench_report.row(mine)))["by round"] == "1.02/0.90/0.99"
    one_round = bench.summarise(cell, bench.merge_rounds(ours[:1]))
    assert bench_report.rounds_label(bench.by_round(one_round, results[1])) == "-"  # rounds differ


def test_no_baseline_is_launched_for_a_model_only_hvdcls_builds():
    spec = bench.BenchSpec(backends=["torch", "tensorflow"], nps=[2], compressions=["none"],
                           batch_sizes=[16], models=["compact_cnn", "resnet18"])
    with_baselines = {(c.runner, c.model) for c in bench.cells(spec) if c.runner != "hvdcls"}
    assert {model for _, model in with_baselines} == {"resnet18"}
    assert {runner for runner, _ in with_baselines} == {"raw-horovod", "ddp", "mwms"}
