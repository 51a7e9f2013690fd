from tests.single_process import smoke_alone


def test_smoke_runs_without_a_launcher(tmp_path):
    report = smoke_alone("tensorflow", tmp_path)
    assert report["passed"] and report["size"] == 1
    assert report["versions"]["keras"].startswith("3.")  # the Keras 3 path is what we test
    # One rank: the step is plain SGD on its own batch, and it must have moved the weights.
    assert report["step_size"] > 0 and report["step_error"] < 1e-5
