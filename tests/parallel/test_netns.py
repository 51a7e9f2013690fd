"""The bench's shaped-link hosts: two network namespaces over a tc-shaped veth pair (tbf: this kernel has no netem for delays), each with
its own sshd; a real Horovod all-reduce crosses between them; nothing is left afterwards, also
when the job inside fails."""
import subprocess
import sys

import pytest

from hvdcls import launch, netns
from hvdcls.netns import Link, ShapedHosts

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
        result = subprocess.run(hosts.horovodrun(2, [sys.executable, "-c", SUM], launch.venv_tool("horovodrun")),
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


def test_the_sweep_times_gradients_under_each_fusion_setting_across_the_link(tmp_path):
    from hvdcls import bench

    spec = bench.BenchSpec(models=["mobilenet_v3_small"], link_mbit=1000, sweep_fusion_mb=[0.0, 32.0],
                           sweep_cycle_ms=[5.0], timeout=300)
    with ShapedHosts(Link(rate_mbit=spec.link_mbit)) as hosts:
        sweep = bench.allreduce_sweep(spec, hosts, tmp_path)
    assert "error" not in sweep, sweep
    assert [(r["fusion_mb"], r["cycle_ms"]) for r in sweep["gradients"]] == [(32.0, 5.0), (0.0, 5.0)]
    for row in sweep["sweep"] + sweep["gradients"]:
        assert "error" not in row, row
        # A ring cannot beat the link it crosses (10% slack for tbf's bucket).
        assert 0 < row["share_of_link"] <= 1.1, row
    assert sweep["gradients"][0]["tensors"] > 100  # mobilenet_v3_small's parameter tensors
