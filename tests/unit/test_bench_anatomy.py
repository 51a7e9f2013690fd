"""The step anatomy's probe (hvdcls.bench.anatomy) and its report (hvdcls.bench.anatomy_report),
on this process's own threads and on timelines and profiles written here."""
import json
import threading
import time

from hvdcls.bench import anatomy, anatomy_report

MS = 1_000_000  # ns


class Parameter:
    """What the probe needs of a torch parameter: requires_grad and the post-accumulate hook."""

    def __init__(self):
        self.requires_grad, self.hooks = True, []

    def register_post_accumulate_grad_hook(self, hook):
        self.hooks.append(hook)

    def accumulated(self):
        for hook in self.hooks:
            hook(self)


def busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_probe_records_steps_gradients_and_threads_inside_its_window_only(tmp_path):
    params = {"fc.bias": Parameter(), "conv.weight": Parameter()}
    probe = anatomy.Probe(tmp_path, rank=1)
    probe.watch_gradients(params.items())
    step = probe.timed(lambda: [p.accumulated() for p in params.values()])
    step()  # before the window: nothing recorded
    stop = threading.Event()
    sleeper = threading.Thread(target=lambda: [stop.wait(0.002) for _ in range(200)])
    sleeper.start()
    with probe.window():
        assert json.loads((tmp_path / "rank1.started").read_text())["pid"] > 0
        for _ in range(2):
            step()
            busy(0.05)
        probe.reduced("bucket0", 1, 2, 8)
    sleeper.join()
    step()  # after it: nothing either
    kept = json.loads((tmp_path / "rank1.json").read_text())
    assert len(kept["steps"]) == 2 and all(start <= end for start, end in kept["steps"])
    assert [(s, name) for s, name, _ in kept["ready"]] == [(0, "fc.bias"), (0, "conv.weight"),
                                                           (1, "fc.bias"), (1, "conv.weight")]
    assert kept["reductions"] == [[1, "bucket0", 1, 2, 8]]
    main = kept["threads"][str(kept["pid"])]
    assert main["cpu_seconds"] >= 0.05 and main["run_seconds"] >= 0.05
    assert max(t["voluntary_switches"] for t in kept["threads"].values()) > 10  # the sleeper woke


def test_no_hooks_no_gradient_record(tmp_path):
    parameter = Parameter()
    anatomy.Probe(tmp_path, 0, hooks=False).watch_gradients([("w", parameter)])
    assert parameter.hooks == []


def write_timeline(path, start_us, events):
    head = [{"name": "process_name", "ph": "M", "pid": 0,
             "args": {"start_time_since_epoch_in_micros": start_us}}]
    path.write_text(json.dumps(head + events))


def span(pid, name, begin_us, end_us):
    return [{"ph": "B", "pid": pid, "name": name, "ts": begin_us}, {"ph": "E", "pid": pid, "ts": end_us}]


def test_horovod_phases_from_the_timeline_laid_over_the_hooks(tmp_path):
    """Two gradients: fc.bias ready at 10 ms, conv.weight at 20 ms into the step; Horovod reduces
    conv.weight first (round 22-30 ms) then fc.bias (31-40 ms); the step ends at 45 ms."""
    start_us = 1_000_000
    step_start = start_us * 1000  # ns: the timeline's 0 is the step's start
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.fc.bias"}},
              {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.conv.weight"}},
              *span(1, "NEGOTIATE_ALLREDUCE", 12_000, 21_000), *span(2, "NEGOTIATE_ALLREDUCE", 21_000, 22_000),
              *span(2, "ALLREDUCE", 22_000, 30_000), *span(1, "ALLREDUCE", 31_000, 40_000),
              {"ph": "B", "pid": 1, "name": "GLOO_ALLREDUCE", "ts": 32_000},  # an activity: nested
              {"ph": "E", "pid": 1, "ts": 33_000}]
    events += [{"ph": "i", "name": "CYCLE_START", "ts": t, "s": "g"} for t in (5_000, 15_000, 25_000, 99_000)]
    events.sort(key=lambda e: e.get("ts", 0))
    probe = tmp_path / "probe"
    probe.mkdir()
    write_timeline(probe / "timeline.json", start_us, events)
    rank = {"rank": 0, "pid": 1, "window_ns": [step_start, step_start + 50 * MS], "threads": {},
            "steps": [[step_start, step_start + 45 * MS]],
            "ready": [[0, "fc.bias", step_start + 10 * MS], [0, "conv.weight", step_start + 20 * MS]],
            "reductions": []}
    (probe / "rank0.json").write_text(json.dumps(rank))
    (probe / "result.json").write_text(json.dumps({"images_per_sec": [10.0, 12.0, 11.0]}))
    summary = anatomy_report.probe_summary(probe)
    phases = summary["phases"]
    assert summary["images_per_sec"] == 11.0 and summary["gradients"] == 2
    assert phases["forward_ms"] == 10 and phases["backward_ms"] == 10
    assert phases["tail_ms"] == 20 and phases["update_ms"] == 5 and phases["rounds"] == 2
    assert phases["communication_busy_ms"] == 17
    assert phases["ready_to_reduce_ms"] == (21 + 2) / 2 and phases["ready_to_reduce_max_ms"] == 21
    assert phases["negotiation_ms"] == (9 + 1) / 2
    assert phases["cycles"] == 3  # the marks inside the step
    assert phases["out_of_order"] == 1.0  # the one pair went the other way round


def test_ddp_phases_from_its_bucket_hook(tmp_path):
    t0 = 5_000 * MS
    rank = {"rank": 0, "pid": 1, "window_ns": [t0, t0 + 100 * MS], "threads": {},
            "steps": [[t0, t0 + 50 * MS]], "ready": [[0, "a", t0 + 20 * MS], [0, "b", t0 + 30 * MS]],
            "reductions": [[0, "bucket0", t0 + 21 * MS, t0 + 28 * MS, 4],
                           [0, "bucket1", t0 + 31 * MS, t0 + 40 * MS, 4]]}
    (tmp_path / "rank0.json").write_text(json.dumps(rank))
    phases = anatomy_report.probe_summary(tmp_path)["phases"]
    assert phases["tail_ms"] == 10 and phases["rounds"] == 2 and phases["update_ms"] == 10
    assert phases["cycles"] is None and phases["negotiation_ms"] is None


def test_order_counts_only_pairs_ordered_both_ways():
    ready = {"a": 1, "b": 2, "c": 3}
    assert anatomy_report.discordant_share(ready, {"a": 1, "b": 2, "c": 3}) == 0
    assert anatomy_report.discordant_share(ready, {"a": 3, "b": 2, "c": 1}) == 1
    assert anatomy_report.discordant_share(ready, {"a": 5, "b": 5, "c": 6}) == 0  # a and b fused


PERF = """# comment
     40.00%\t  100:python \tlibtorch_cpu.so \t[.] dnnl::conv
     10.00%\t  101:python \tmpi_lib_v2.cpython-311-x86_64-linux-gnu.so \t[.] gloo::sum<float>
      5.00%\t  101:python \t[kernel.kallsyms] \t[k] finish_task_switch
      3.00%\t  102:python \t[kernel.kallsyms] \t[k] _copy_to_iter
      2.00%\t  104:python \tlibtorch_cpu.so \t[.] gloo::sum<float>
      1.00%\t  105:python \tmpi_lib_v2.cpython-311-x86_64-linux-gnu.so \t[.] gloo::transport::tcp::Loop::run
"""


def test_threads_get_roles_from_their_perf_symbols(tmp_path):
    (tmp_path / "perf.txt").write_text(PERF)
    symbols = anatomy_report.perf_symbols(tmp_path / "perf.txt")
    assert set(symbols) == {100, 101, 102, 104, 105}
    counters = {"cpu_seconds": 1.0, "run_seconds": 1.0, "runqueue_wait_seconds": 0.5,
                "voluntary_switches": 200, "involuntary_switches": 20}
    rank = {"pid": 100, "window_ns": [0, 2_000 * MS],
            "threads": {str(t): {"name": "python", **counters} for t in (100, 101, 102, 103, 104, 105)}}
    rows = {r["tid"]: r for r in anatomy_report.thread_rows(rank, symbols)}
    assert rows[100]["role"].startswith("Python main")
    assert rows[101]["role"] == "Horovod background"
    assert rows[102]["role"] == "socket I/O (Gloo's transport loop)"
    assert rows[104]["role"] == "torch c10d Gloo worker" and rows[103]["role"] == "other"
    assert rows[105]["role"] == "Gloo transport loop"  # inside Horovod's library, not its thread
    assert anatomy_report.short_symbol("a::f<int, b<c>>::g(x, y)") == "a::f::g"
    assert rows[101]["cpu_share"] == 0.5 and rows[101]["voluntary_per_second"] == 100
    assert rows[101]["top_symbols"][0] == "gloo::sum (mpi_lib_v2, 10%)"


def test_py_spy_stacks_become_shares(tmp_path):
    (tmp_path / "spy.txt").write_text(
        "thread (1): MainThread;main (w.py:1);step (w.py:9);backward (t.py:3) 3\n"
        "thread (1): MainThread;main (w.py:1);step (w.py:9);synchronize (o.py:7);wait (?) 1\n")
    spy = anatomy_report.py_spy_summary(tmp_path / "spy.txt")
    assert spy["samples"] == 4
    # not the chain every sample is inside
    assert dict(spy["inclusive"]) == {"backward (t.py:3)": 0.75, "synchronize (o.py:7)": 0.25}
    assert spy["self"][0] == ("backward (t.py:3)", 0.75)


def test_the_report_reads_a_run_directory(tmp_path):
    probe = tmp_path / "ddp" / "probe"
    probe.mkdir(parents=True)
    test_ddp_phases_from_its_bucket_hook(probe)
    profile = tmp_path / "ddp" / "profile"
    profile.mkdir()
    (profile / "perf-rank0.txt").write_text(PERF)
    rank = {"rank": 0, "pid": 100, "window_ns": [0, 2_000 * MS], "steps": [], "ready": [], "reductions": [],
            "threads": {"100": {"name": "python", "cpu_seconds": 1.5, "run_seconds": 1.5,
                                "runqueue_wait_seconds": 0.1, "voluntary_switches": 4, "involuntary_switches": 2}}}
    (profile / "rank0.json").write_text(json.dumps(rank))
    report = anatomy_report.build(tmp_path)
    assert set(report["stacks"]) == {"ddp"}
    text = anatomy_report.markdown(report)
    assert "| tail_ms | 10.0 |" in text and "## ddp: threads" in text
    assert "| 100 | Python main (forward, backward, optimizer) | 1.50 | 75% |" in text
