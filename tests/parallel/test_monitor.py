"""Watching a real 2-rank run: its Prometheus endpoint scraped while it runs, the Horovod
timeline it recorded summarised, and `hvdcls report` drawn from real run directories.

No assertion depends on timing: the run is started with output.metrics_linger_seconds, so
rank 0 keeps serving after training until one scrape has seen the final values; the scrape
loop ends on the run's own `hvdcls_training_done` metric, not on a clock.
"""
import json
import math
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hvdcls.launching import launch
from tests.parallel.test_train import DIGITS, NP
from tests.run_files import read_json, read_metrics

pytestmark = pytest.mark.parallel
EPOCHS = 3
ENDPOINT = re.compile(r"metrics: Prometheus endpoint on (http://\S+/metrics)")
MAX_SCRAPES = 1200  # a bound, not a clock: the loop ends when the run says it is done
GRADIENT_BYTES_PER_STEP = 66_410 * 4  # compact_cnn on 10 classes, float32 gradients


class Job:
    """A horovodrun job whose merged output is collected by a thread (so the pipe never fills)."""

    def __init__(self, command: list[str], cwd):
        cmd, env = launch.local_job("horovodrun", NP, command)
        self.process = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.url, self.url_seen = None, threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            match = ENDPOINT.search(line)
            if match and self.url is None:
                self.url = match.group(1).replace("0.0.0.0", "127.0.0.1")
                self.url_seen.set()
        self.url_seen.set()  # the job ended: stop waiting for a URL either way

    def output(self) -> str:
        return "".join(self.lines)[-5000:]


def scrape(url: str) -> dict:
    """{(name, ((label, value), ...)): value} of one scrape."""
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    wanted = {"backend": "torch", "model": "compact_cnn", **labels}
    return samples[(name, tuple(sorted(wanted.items())))]


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory):
    """torch, 2 ranks, 3 epochs, metrics on a free port, a Horovod timeline; scraped until done."""
    work = tmp_path_factory.mktemp("watched")
    out, timeline = work / "run", work / "timeline.json"
    job = Job(launch.hvdcls_command(
        "train", "--backend", "torch", "--config", DIGITS, "--epochs", str(EPOCHS),
        "--output-dir", str(out), "--metrics-port", "0", "output.metrics_host=127.0.0.1",
        "output.metrics_linger_seconds=600", f"horovod.timeline={timeline}"), work)
    scrapes = []
    try:
        assert job.url_seen.wait(300) and job.url, job.output()
        for _ in range(MAX_SCRAPES):
            assert job.process.poll() is None, "the run ended before a scrape saw it done\n" + job.output()
            scrapes.append(scrape(job.url))
            if value(scrapes[-1], "hvdcls_training_done") == 1:
                break
            time.sleep(0.25)
        assert job.process.wait(timeout=300) == 0, job.output()
    finally:
        if job.process.poll() is None:
            job.process.kill()
    job.reader.join(timeout=30)
    return out, timeline, scrapes, "".join(job.lines)


def test_the_endpoint_holds_the_runs_final_numbers(watched_run):
    out, _, scrapes, _ = watched_run
    final, metrics = scrapes[-1], read_metrics(out)
    last = metrics[-1]
    assert value(final, "hvdcls_training_done") == 1
    assert value(final, "hvdcls_epoch") == value(final, "hvdcls_epochs") == EPOCHS
    assert value(final, "hvdcls_world_size") == NP
    steps = value(final, "hvdcls_steps_total")
    assert steps == sum(r["steps"] for r in metrics)
    batch = read_json(out / "summary.json")["config"]["training"]["batch_size"]
    assert value(final, "hvdcls_images_total") == steps * batch * NP
    assert value(final, "hvdcls_images_per_second") == pytest.approx(last["images_per_sec"])
    assert value(final, "hvdcls_accuracy", split="val") == pytest.approx(last["val_accuracy"])
    assert value(final, "hvdcls_accuracy", split="train") == pytest.approx(last["train_accuracy"])
    assert value(final, "hvdcls_loss", split="val") == pytest.approx(last["val_loss"])
    assert value(final, "hvdcls_learning_rate") == pytest.approx(last["lr"])
    train_loss = value(final, "hvdcls_loss", split="train")
    assert math.isfinite(train_loss) and 0 < train_loss < 2.31  # below chance (ln 10) after training


def test_step_data_and_allreduce_times_are_consistent(watched_run):
    """torch times its all-reduce wait inside the step: a part of step time, never more."""
    out, _, scrapes, _ = watched_run
    final = scrapes[-1]
    step_total = value(final, "hvdcls_step_seconds_total")
    allreduce_total = value(final, "hvdcls_allreduce_wait_seconds_total")
    assert step_total > 0 and value(final, "hvdcls_last_step_seconds") > 0
    assert 0 <= allreduce_total <= step_total
    assert value(final, "hvdcls_data_wait_seconds_total") >= 0
    assert 0 <= value(final, "hvdcls_allreduce_share") <= 1
    for record in read_metrics(out):
        assert 0 <= record["allreduce_wait_seconds"] <= record["step_seconds"] <= record["train_seconds"]
        assert 0 <= record["data_wait_share"] <= 1


def test_counters_only_grow_across_scrapes(watched_run):
    _, _, scrapes, _ = watched_run
    for name in ("hvdcls_steps_total", "hvdcls_images_total", "hvdcls_step_seconds_total"):
        seen = [value(s, name) for s in scrapes if any(key[0] == name for key in s)]
        assert seen == sorted(seen), name


def test_only_rank_0_serves_and_prints_progress(watched_run):
    out, _, _, output = watched_run
    assert len(ENDPOINT.findall(output)) == 1, output[-3000:]
    for epoch in range(1, EPOCHS + 1):
        assert len(re.findall(rf"epoch {epoch}: train loss", output)) == 1, output[-3000:]
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any((out / "tensorboard").glob("events.out.tfevents.*"))


def timeline_summary(path) -> dict:
    result = subprocess.run([sys.executable, "-m", "hvdcls", "timeline", str(path), "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_timeline_summary_of_the_real_run(watched_run):
    out, timeline, _, _ = watched_run
    summary = timeline_summary(timeline)
    steps = sum(r["steps"] for r in read_metrics(out))
    assert summary["complete"] and summary["unparsed_chars"] == 0
    allreduce = summary["ops"]["ALLREDUCE"]
    # every step all-reduces every gradient tensor (14 in compact_cnn) and all their bytes
    assert allreduce["count"] >= steps * 14
    assert allreduce["bytes"] >= steps * GRADIENT_BYTES_PER_STEP
    assert summary["ops"]["NEGOTIATE_ALLREDUCE"]["count"] == allreduce["count"]
    assert 0 < summary["rounds"] <= allreduce["count"] + summary["ops"]["BROADCAST"]["count"] + 10
    assert 0 < summary["fused_bytes"] <= sum(op["bytes"] for op in summary["ops"].values())
    assert 0 < summary["communication_share"] < 1
    assert 0 < summary["communication_seconds"] <= summary["traced_seconds"]


def test_timeline_summary_of_a_cut_off_copy(watched_run, tmp_path):
    """A running job's timeline has no closing ']' and may end mid-event."""
    _, timeline, _, _ = watched_run
    whole = timeline.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: len(whole) // 2 + 17])
    full, partial = timeline_summary(timeline), timeline_summary(cut)
    assert not partial["complete"]
    assert 0 < partial["events"] < full["events"]
    assert partial["ops"]["ALLREDUCE"]["count"] <= full["ops"]["ALLREDUCE"]["count"]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_compares_torch_and_tensorflow_runs(watched_run, demo_run, tmp_path):
    """Against the session's TensorFlow demo run (tests/parallel/conftest.py: test_train and
    test_powersgd read it too), not a launch of its own; the report only reads run folders."""
    torch_run, _, _, _ = watched_run
    tf_run = demo_run("tensorflow")
    png = tmp_path / "compare.png"
    result = subprocess.run([sys.executable, "-m", "hvdcls", "report", str(torch_run), str(tf_run),
                             "-o", str(png)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = png.read_bytes()
    width, height = png_size(data)
    assert (width, height) == (1100, 750) and len(data) > 30_000
    table = png.with_suffix(".md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| torch") or line.startswith("| tensorflow")]
    assert [row.split(" | ")[0] for row in rows] == [f"| torch np={NP}", f"| tensorflow np={NP}"]
    tf_row = rows[1].split(" | ")
    assert tf_row[9] == "n/a"  # TensorFlow's all-reduce wait is not measured, and says so
    assert table in result.stdout
    for run in (torch_run, tf_run):  # each run's own report: a third row, the last validation's matrix
        width, height = png_size((run / "report.png").read_bytes())
        assert (width, height) == (1100, 1050)


def test_a_busy_metrics_port_stops_every_rank_with_one_line(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        command = launch.hvdcls_command("train", "--config", DIGITS, "--output-dir", str(tmp_path / "run"),
                                        "--metrics-port", str(port), "output.metrics_host=127.0.0.1")
        cmd, env = launch.local_job("horovodrun", NP, command)
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if f"hvdcls: error: --metrics-port {port}: cannot listen" in line]
    assert len(lines) == NP, (result.stdout + result.stderr)[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
