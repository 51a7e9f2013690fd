"""MLflow tracking's contract without a server (tests/parallel/test_tracking.py has the real one):
a tracker that is down, or mlflow missing, costs one warning line and never holds up training."""
import socket
import sys
import time

from hvdcls import config as cfg
from hvdcls.observe.monitor import RunInfo
from hvdcls.observe.tracking import MlflowSink, epoch_metrics, flatten, one_line
from hvdcls.training.outputs import RunOutputs
from hvdcls.training.run import make_sinks

INFO = RunInfo("torch", "compact_cnn", "digits", 2, 2, 10, 0)
RECORD = {"epoch": 1, "val_accuracy": 0.5, "train_loss": 1.2, "train_images": 1600,
          "allreduce_share": None, "balance_batches": [16, 16]}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("hvdcls: warning: MLflow")]


def test_the_config_flattens_into_dotted_params():
    assert flatten({"optimizer": {"lr": 0.4, "lr_find": {"steps": 100}}, "data": {"mean": [0.5, 0.5]},
                    "model": {"num_classes": None}}) == {
        "optimizer.lr": "0.4", "optimizer.lr_find.steps": "100", "data.mean": "[0.5, 0.5]",
        "model.num_classes": "None"}
    assert len(flatten({"k": "x" * 10_000})["k"]) == 6000  # MLflow's limit on a param's value


def test_an_epochs_numbers_are_its_metrics_and_the_epoch_its_step():
    assert epoch_metrics(RECORD) == {"val_accuracy": 0.5, "train_loss": 1.2, "train_images": 1600.0}


def test_a_tracker_that_is_down_costs_one_warning_not_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    sink = MlflowSink(f"http://127.0.0.1:{closed_port()}", "hvdcls", {"a": {"b": 1}}, tmp_path)
    began = time.monotonic()
    sink.start(INFO)
    for epoch in (1, 2):
        sink.epoch({**RECORD, "epoch": epoch}, [])
    sink.finish()
    assert time.monotonic() - began < 0.5  # training never waits on the tracker
    sink.close()
    assert time.monotonic() - began < 30  # mlflow's import, then one refused connection
    lines = warnings_in(capsys.readouterr().err)
    assert len(lines) == 1 and "is off for the rest of this run" in lines[0], lines
    assert sink.off and not sink.thread.is_alive()


def test_mlflow_missing_is_one_warning_naming_the_extra(tmp_path, monkeypatch, capsys):
    for name in ("mlflow", "mlflow.tracking", "mlflow.entities"):
        monkeypatch.setitem(sys.modules, name, None)  # import mlflow... raises ImportError
    sink = MlflowSink("http://127.0.0.1:5000", "hvdcls", {}, tmp_path)
    sink.start(INFO)
    sink.epoch(RECORD, [])
    sink.failed("boom")
    sink.close(wait=10)
    lines = warnings_in(capsys.readouterr().err)
    assert len(lines) == 1 and "hvdcls[track]" in lines[0], lines


def test_an_end_before_training_began_sends_nothing(tmp_path, capsys):
    """A run that fails before its first epoch has no MLflow run to end: nothing is sent, and
    there is nothing to warn about (the URI is never asked)."""
    sink = MlflowSink(f"http://127.0.0.1:{closed_port()}", "hvdcls", {}, tmp_path)
    sink.failed("config error")
    sink.close(wait=30)
    assert warnings_in(capsys.readouterr().err) == [] and not sink.off


def test_long_errors_are_cut_to_one_short_line():
    line = one_line(RuntimeError("API request failed " + "x" * 1000 + "\nretry history"))
    assert line.startswith("RuntimeError: API request failed") and len(line) == 300 and "\n" not in line


def test_the_flag_and_key_add_the_tracker_last(tmp_path):
    from hvdcls.cli import build_parser, parse, train_flags

    flags = train_flags(parse(build_parser(), ["train", "--mlflow", "http://127.0.0.1:5000"]))
    config = cfg.load(None, ["output.mlflow_experiment=digits", "output.tensorboard=false"], flags)
    assert config.output.mlflow_uri == "http://127.0.0.1:5000"
    sinks = make_sinks(config, "torch", RunOutputs(tmp_path, enabled=True))
    try:
        assert isinstance(sinks[-1], MlflowSink) and sinks[-1].experiment == "digits"
        assert sinks[-1].config["optimizer"]["lr"] == config.optimizer.lr
    finally:
        sinks[-1].off = True  # nothing to send: this test only builds the watchers
        sinks[-1].close(wait=10)
    assert not any(isinstance(s, MlflowSink) for s in make_sinks(cfg.load(), "torch",
                                                                 RunOutputs(tmp_path, enabled=True)))
