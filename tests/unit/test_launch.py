"""Launcher command lines: what the tests run is what the README tells users to type."""
import pytest

from hvdcls.launching import launch


def test_hosts_arg_matches_horovodrun_syntax():
    assert launch.hosts_arg({"host1": 4, "host2": 4}) == "host1:4,host2:4"


def test_horovodrun_gloo_command():
    cmd = launch.horovodrun(8, ["hvdcls", "smoke"], hosts={"host1": 4, "host2": 4})
    assert cmd[0].endswith("horovodrun")
    assert cmd[1:] == ["-np", "8", "-H", "host1:4,host2:4", "--gloo", "hvdcls", "smoke"]


def test_horovodrun_elastic_command_lets_a_failed_host_back():
    cmd = launch.horovodrun_elastic(2, 1, 3, "./hosts.sh", ["hvdcls", "train"])
    assert cmd[1:] == ["-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script",
                       "./hosts.sh", "--elastic-timeout", "60", "--gloo",
                       "--blacklist-cooldown-range", "2", "5", "hvdcls", "train"]
    alone = launch.horovodrun_elastic(1, 1, 1, "d", [], cooldown=None, network_interface="lo")
    assert "--blacklist-cooldown-range" not in alone and alone[-2:] == ["--network-interface", "lo"]


def test_mpirun_command_has_horovods_recommended_flags(monkeypatch):
    monkeypatch.setattr(launch.os, "geteuid", lambda: 1000)
    cmd = launch.mpirun(2, ["x"], env={"PATH": "/bin", "OMP_NUM_THREADS": "1", "HOME": "/root"})
    joined = " ".join(cmd)
    assert "-np 2 -H localhost:2" in joined
    assert "-bind-to none -map-by slot -mca pml ob1 -mca btl ^openib" in joined
    assert "-x PATH" in joined and "-x OMP_NUM_THREADS" in joined
    assert "-x HOME" not in joined  # only what ranks need, not the whole environment
    assert "--allow-run-as-root" not in cmd and cmd[-1] == "x"


def test_mpirun_as_root_allows_it(monkeypatch):
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0)
    assert "--allow-run-as-root" in launch.mpirun(2, ["x"], env={})


def test_local_job_gives_each_rank_one_thread(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cmd, env = launch.local_job("mpirun", 2, ["x"])
    assert env["OMP_NUM_THREADS"] == "1" and "OMP_NUM_THREADS" in cmd


def test_local_job_rejects_unknown_launcher():
    with pytest.raises(ValueError, match="horovodrun, mpirun"):
        launch.local_job("srun", 2, ["x"])
