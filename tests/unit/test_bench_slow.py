"""`hvdcls bench --slow-rank R=F --balance off dynamic` and the bench's guard on its figures,
without launching anything (hvdcls.bench.slow, hvdcls.bench.guard, their part of the matrix)."""
import os
import subprocess
import sys

import pytest

from hvdcls.bench import guard, matrix as bench, report as bench_report, slow
from hvdcls.errors import UserError
from tests.unit.test_bench import raw


def test_slow_rank_parses_and_refuses_nonsense_in_one_line():
    assert slow.SlowRank.parse("1=0.5") == slow.SlowRank(1, 0.5)
    for bad in ("1", "x=0.5", "1=0", "1=1.5", "-1=0.5"):
        with pytest.raises(UserError, match="RANK=FRACTION"):
            slow.SlowRank.parse(bad)


def test_the_quota_is_the_fraction_of_the_rank_s_cores(tmp_path):
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    slow.set_threads(tmp_path, 0.5, 2)
    assert (tmp_path / "cpu.cfs_quota_us").read_text() == "100000"
    assert slow.quota_us(0.001, 1, 100000) == 1000  # the kernel's floor


def test_a_missing_controller_is_one_line(tmp_path):
    with pytest.raises(UserError, match="needs root and the cgroup v1 cpu controller"):
        with slow.throttled_cgroup(slow.SlowRank(1, 0.5), root=tmp_path / "absent"):
            pass


def test_the_wrapper_joins_the_cgroup_on_its_rank_only_and_runs_the_command(tmp_path):
    for rank, joined in (("1", True), ("0", False)):
        group = tmp_path / rank
        group.mkdir()
        env = {**os.environ, "HOROVOD_RANK": rank}
        done = subprocess.run(slow.wrap([sys.executable, "-c", "print('ran')"], group, 1), env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
        assert (group / "cgroup.procs").exists() == joined


def test_dynamic_cells_pair_with_off_ones_and_only_off_ones_get_baselines():
    spec = bench.BenchSpec(backends=["torch"], nps=[1, 2], compressions=["none"], batch_sizes=[16],
                           models=["m"], balances=["off", "dynamic"], slow_rank="1=0.5")
    cells = bench.cells(spec)
    assert {(c.runner, c.np, c.balance) for c in cells} == {
        ("hvdcls", 1, "off"), ("hvdcls", 2, "off"), ("hvdcls", 2, "dynamic"),
        ("raw-horovod", 1, "off"), ("raw-horovod", 2, "off")}  # no DDP under --slow-rank
    dynamic = next(c for c in cells if c.balance == "dynamic")
    group = bench.command(dynamic, spec, bench.Path("out.json"), throttle=(bench.Path("/cg"), 1))
    assert "hvdcls.bench.slow" in group and group[group.index("--balance") + 1] == "dynamic"


def test_vs_balance_off_compares_the_same_cell():
    results = [bench.summarise(bench.Cell("hvdcls", "torch", n, "none", 16, "m", balance=b), raw([v]))
               for n, b, v in [(1, "off", 100.0), (2, "off", 120.0), (2, "dynamic", 168.0)]]
    bench.add_ratios(results)
    by = {(r["np"], r["balance"]): r for r in results}
    assert by[(2, "dynamic")]["vs_balance_off"] == pytest.approx(1.4)
    assert by[(2, "dynamic")]["scaling_efficiency"] == pytest.approx(168.0 / 200.0)
    assert by[(2, "off")]["vs_balance_off"] is None


@pytest.mark.parametrize("flags,words", [
    (dict(slow_rank="2=0.5", nps=[1, 2]), "no cell has a rank 2"),
    (dict(balances=["off", "dynamic"], nps=[1]), "--balance dynamic balances np>1 cells"),
])
def test_bench_flags_that_cannot_work_are_one_line(flags, words):
    with pytest.raises(UserError, match=words):
        bench.validate(bench.BenchSpec(**flags))


def test_the_guard_counts_what_others_used(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 1000 0 0 0 0 0 0\n")
    with guard.CpuGuard(stat) as watch:
        stat.write_text("cpu  400 0 100 1000 0 0 0 0 0 0\n")  # 3 s busy (100 ticks/s), not ours
    assert watch.outside.cpu_seconds == pytest.approx(3.0 * 100 / os.sysconf("SC_CLK_TCK"), abs=0.05)
    # ranks in containers are no descendants of the bench: their CPU is counted as ours by hand
    used = iter([5.0, 5.0 + 3.0 * 100 / os.sysconf("SC_CLK_TCK")])
    stat.write_text("cpu  100 0 100 1000 0 0 0 0 0 0\n")
    with guard.CpuGuard(stat, ours=lambda: next(used)) as watch:
        stat.write_text("cpu  400 0 100 1000 0 0 0 0 0 0\n")
    assert watch.outside.cpu_seconds == pytest.approx(0.0, abs=0.05)
    quiet, loaded = guard.Outside(10.0, 0.1, 2), guard.Outside(10.0, 6.0, 2)
    assert guard.summarise([quiet]) == {"outside_cpu_seconds": 0.1, "outside_cpu_share": 0.005, "busy": False}
    flagged = guard.summarise([quiet, loaded])
    assert flagged["busy"] and flagged["outside_cpu_share"] == 0.3


def test_a_process_s_seconds_include_what_it_reaped():
    """What the guard adds for ranks started over ssh in the link's namespaces: the sshd's own
    CPU and its reaped children's. A shell that reaped a child which burned ~0.4 s counts it."""
    import subprocess
    import sys

    burn = "import time; t = time.process_time(); exec('while time.process_time() - t < 0.4: pass')"
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{burn}"; echo reaped; sleep 30'],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout is not None and shell.stdout.readline().strip() == "reaped"
        assert guard.process_seconds(shell.pid) >= 0.35
    finally:
        shell.kill()
        shell.wait()
    assert guard.process_seconds(shell.pid) == 0.0  # gone: nothing to add


def test_the_table_flags_a_busy_cell_and_shows_the_plan():
    cell = bench.summarise(bench.Cell("hvdcls", "torch", 2, "none", 16, "m", balance="dynamic"),
                           {**raw([100.0]), "balance": {"batches": [21, 11]},
                            "outside": [guard.Outside(10.0, 6.0, 2)]})
    bench.add_ratios([cell])
    row = dict(zip(bench_report.COLUMNS, bench_report.row(cell)))
    assert row["balance"] == "dynamic 21/11" and row["outside CPU"] == "30% !"


def test_the_compose_bench_spreads_4_ranks_over_the_unequal_workers_and_says_so():
    """tools/bench_unequal.py (make bench-unequal): what the launcher runs, and the table's note."""
    import bench_unequal

    args = bench_unequal.parse(["--cpus-worker2", "0.25"])
    cell = bench.Cell("hvdcls", "tensorflow", 4, "none", 16, "resnet18", "memory", "dynamic")
    command = bench_unequal.launch(cell, args)
    launcher = command.index("launcher")
    assert command[launcher + 1:launcher + 9] == ["horovodrun", "--gloo", "-np", "4", "-H",
                                                   "worker1:2,worker2:2", "-p", "12345"]
    assert "HOROVOD_FUSION_THRESHOLD=33554432" in command and "OMP_NUM_THREADS=1" in command
    assert command[launcher + 9:launcher + 13] == ["--network-interfaces", "eth0", "--start-timeout", "300"]
    flags = dict(zip(command[launcher + 16::2], command[launcher + 17::2]))
    assert flags["--balance"] == "dynamic" and flags["--backend"] == "tensorflow"
    assert flags["--out"].startswith("/shared/")  # rank 0 writes where the launcher reads
    label = bench_report.slow_label(bench_unequal.spec(args))
    assert label == " (2 ranks in each compose worker, CPU caps in cores: worker1 1, worker2 0.25)"
