"""The bench's shaped-link hosts: two network namespaces over a tc-shaped veth pair (tbf: this kernel has no netem for delays), each with
its own sshd; a real Horovod all-reduce crosses between them; nothing is left afterwards, also
when the job inside fails."""
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdcls.bench import netns
from hvdcls.bench.netns import Link, ShapedHosts, bucket_bytes
from hvdcls.launching import launch

UNAVAILABLE = netns.unavailable_reason()  # probes by making a namespace: once per session
pytestmark = [pytest.mark.parallel,
              pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no network namespaces here: {UNAVAILABLE}")]
SUM = ("import horovod.torch as hvd, torch; hvd.init(); "
       "print('sum', hvd.allreduce(torch.ones(3) * (hvd.rank() + 1), op=hvd.Sum).tolist())")


def qdiscs(hosts: ShapedHosts, index: int) -> str:
    return subprocess.run(["ip", "netns", "exec", hosts.namespaces[index], "tc", "qdisc", "show",
                           "dev", netns.INTERFACE], capture_output=True, text=True, check=True).stdout


def test_an_allreduce_crosses_the_shaped_link_and_everything_is_removed():
    with ShapedHosts(Link(rate_mbit=200)) as hosts:
        assert hosts.exists() == hosts.namespaces
        for index in (0, 1):
            shaping = qdiscs(hosts, index)
            assert "tbf" in shaping and "200Mbit" in shaping, shaping
        result = subprocess.run(hosts.horovodrun(2, [sys.executable, "-c", SUM], launch.horovodrun_tool()),
                                env=launch.single_host_env(), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        assert result.stdout.count("sum [3.0, 3.0, 3.0]") == 2, result.stdout[-2000:]
    assert hosts.exists() == []


def test_namespaces_are_removed_when_the_job_fails():
    with pytest.raises(RuntimeError):
        with ShapedHosts(Link(rate_mbit=100)) as hosts:
            made = hosts.exists()
            raise RuntimeError("the job failed")
    assert made == hosts.namespaces and hosts.exists() == []


def sent_bytes(hosts: ShapedHosts, index: int) -> int:
    """What host `index` has sent over its end of the link."""
    stats = Path(f"/sys/class/net/{netns.INTERFACE}/statistics/tx_bytes")
    return int(subprocess.run(["ip", "netns", "exec", hosts.namespaces[index], "cat", str(stats)],
                              capture_output=True, text=True, check=True).stdout)


def test_the_sweep_and_a_ddp_cell_cross_the_link(tmp_path):
    """The sweep times gradients under each fusion setting; then DDP, one torchrun node in each
    namespace, trains across the same link with its PowerSGD hook in one bucket."""
    from hvdcls.bench import matrix as bench

    spec = bench.BenchSpec(models=["mobilenet_v3_small"], link_mbit=1000, sweep_fusion_mb=[0.0, 32.0],
                           sweep_cycle_ms=[5.0], timeout=300, image_size=32, warmup=2, steps=1, reps=1)
    ddp = bench.Cell("ddp", "torch", 2, "powersgd", 4, "mobilenet_v3_small")
    with ShapedHosts(Link(rate_mbit=spec.link_mbit)) as hosts:
        sweep = bench.allreduce_sweep(spec, hosts, tmp_path)
        before = [sent_bytes(hosts, i) for i in (0, 1)]
        cell = bench.run_cell(ddp, spec, tmp_path, hosts)
        sent = [sent_bytes(hosts, i) - before[i] for i in (0, 1)]
    assert "error" not in cell, cell
    assert cell["world_size"] == 2 and cell["images_per_sec"][0] > 0
    assert cell["ddp"]["hook"] == "powerSGD_hook" and cell["ddp"]["buckets"] == 1, cell["ddp"]
    # The parameters' broadcast and the two uncompressed warm-up steps (PowerSGD starts at the
    # third) crossed the link both ways: each rank sent at least a model's float32 twice.
    model_bytes = 4 * 1_500_000  # mobilenet_v3_small, 10 classes: 1.53 M parameters
    assert all(n > 2 * model_bytes for n in sent), sent
    assert "error" not in sweep, sweep
    assert [(r["fusion_mb"], r["cycle_ms"]) for r in sweep["gradients"]] == [(32.0, 5.0), (0.0, 5.0)]
    bucket, ranks = bucket_bytes(Link(rate_mbit=spec.link_mbit)), sweep["world_size"]
    for row in sweep["sweep"] + sweep["gradients"]:
        assert "error" not in row, row
        assert row["share_of_link"] > 0, row
        # A ring cannot beat the link it crosses, except by what tbf's bucket lets through at
        # once: each rank sends 2(n-1)/n of the bytes, no faster than (sent - bucket) / rate
        # (10% slack for timing); a message within the bucket is not held to the rate at all.
        sent = 2 * (ranks - 1) / ranks * row["bytes"]
        if sent > 2 * bucket:
            assert row["share_of_link"] <= 1.1 * sent / (sent - bucket), (row, bucket)
    assert sweep["gradients"][0]["tensors"] > 100  # mobilenet_v3_small's parameter tensors


def bench_namespaces(pid: int) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"hvdcls-{pid}-")]


def ranks_inside(pid: int) -> list[int]:
    """The bench workers running inside the namespaces of the bench with this pid."""
    found = []
    for ns in bench_namespaces(pid):
        for inner in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(OSError):
                if b"hvdcls.bench.worker" in Path(f"/proc/{inner}/cmdline").read_bytes():
                    found.append(int(inner))
    return found


def alive(pid: int) -> bool:
    """Running, or stopped; not gone and not a zombie (killed, its parent yet to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_to_a_shaped_link_bench_kills_its_ranks_and_removes_the_namespaces(tmp_path):
    out = tmp_path / "bench-out"
    bench = subprocess.Popen(launch.hvdcls_command(
        "bench", "--backends", "torch", "--np", "2", "--compression", "none", "--no-baselines",
        "--model", "mobilenet_v3_small", "--image-size", "32", "--batch-size", "4", "--warmup-steps", "1",
        "--steps", "1000", "--reps", "1", "--link-mbit", "100", "--output-dir", str(out), "--quiet"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ranks: list[int] = []
        # Until both ranks run inside the namespaces (np=1 runs first). Each rank is several
        # processes naming the worker (ssh's shell, env, python): "exactly 2" was only ever
        # seen between the two ranks' starts, which the faster launcher no longer leaves.
        for _ in range(1200):
            ranks = ranks_inside(bench.pid)
            if len(ranks) >= 2:
                break
            assert bench.poll() is None, bench.stdout.read()
            time.sleep(0.1)
        assert len(ranks) >= 2
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        bench.kill()
    assert bench_namespaces(bench.pid) == []
    assert not [rank for rank in ranks if alive(rank)]
    assert not (out / "bench.json").exists()


def test_namespaces_of_a_killed_bench_are_removed_by_the_next_one():
    dead = subprocess.Popen(["true"])  # a pid that has surely exited
    dead.wait()
    orphan = f"hvdcls-{dead.pid}-a"
    subprocess.run(["ip", "netns", "add", orphan], check=True)
    try:
        with ShapedHosts(Link(rate_mbit=100)):
            assert orphan not in bench_namespaces(dead.pid)
    finally:
        subprocess.run(["ip", "netns", "delete", orphan], capture_output=True)
