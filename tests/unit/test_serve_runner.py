"""hvdcls.serve.runner.Endpoints: where a running job's rank 0 serves /metrics, from its log."""
from hvdcls.serve import runner


def line(rank_prefix: str, endpoint: str) -> str:
    return f"{rank_prefix}<stdout>:metrics: Prometheus endpoint on http://{endpoint}/metrics\n"


def test_the_last_endpoint_logged_wins_and_a_half_written_line_waits(tmp_path):
    log = tmp_path / runner.STDOUT
    endpoints = runner.Endpoints()
    assert endpoints.of(tmp_path) is None  # no log yet
    log.write_text("[0]<stdout>:epoch 1/3 step 1/10 loss 2.3 \n" + line("[0]", "worker1:41234"))
    assert endpoints.of(tmp_path) == "worker1:41234"
    # An elastic reset: the new rank 0 says where it serves; half of its line is written so far.
    with open(log, "a") as handle:
        handle.write("[0]<stdout>:elastic: rank 0 is now this process on worker2\n")
        handle.write(line("[0]", "worker2:40001")[:40])
    assert endpoints.of(tmp_path) == "worker1:41234"
    with open(log, "a") as handle:
        handle.write(line("[0]", "worker2:40001")[40:] + "[0]<stdout>:epoch 2/3 step 1/10 \n")
    assert endpoints.of(tmp_path) == "worker2:40001"
    assert endpoints.read[log][0] == log.stat().st_size  # each byte read once
    assert endpoints.of(tmp_path) == "worker2:40001"  # nothing new: the same answer
    log.write_text("[0]<stdout>:epoch 1/3 step 1/10 \n")  # written afresh (a truncating sbatch --output)
    assert endpoints.of(tmp_path) is None


def test_forget_drops_the_jobs_no_longer_running(tmp_path):
    one, two = tmp_path / "1", tmp_path / "2"
    for run_dir, endpoint in ((one, "a:1"), (two, "b:2")):
        run_dir.mkdir()
        (run_dir / runner.STDOUT).write_text(line("[1,0]", endpoint))
    endpoints = runner.Endpoints()
    assert (endpoints.of(one), endpoints.of(two)) == ("a:1", "b:2")
    endpoints.forget({two})
    assert list(endpoints.read) == [two / runner.STDOUT]
