"""hvdcls.observe.prometheus: the endpoint serves what the run reported, labelled, and nothing it could
not measure; a busy port is one user error; lingering ends with the first scrape after done."""
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hvdcls.errors import UserError
from hvdcls.observe.monitor import RunInfo, StepSample
from hvdcls.observe.prometheus import METRICS, PrometheusSink

LABELS = {"backend": "tensorflow", "model": "compact_cnn"}
RECORD = {"epoch": 1, "train_accuracy": 0.5, "val_accuracy": 0.75, "val_loss": 0.9, "images_per_sec": 321.0}


def scrape(sink) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def key(name, **extra):
    return name, tuple(sorted({**LABELS, **extra}.items()))


@pytest.fixture
def sink():
    exporter = PrometheusSink(0, "127.0.0.1", LABELS)
    exporter.start(RunInfo("tensorflow", "compact_cnn", "digits", 2, 3, 10, 0))
    yield exporter
    exporter.close()


def step(index, allreduce=None, loss=2.0):
    return StepSample(0, index, images=64, seconds=0.5, data_wait=0.25, allreduce=allreduce, lr=0.1,
                      loss=loss)


def test_port_0_picks_a_free_port(sink):
    assert 0 < sink.port < 65536


def test_values_and_labels_after_steps_and_an_epoch(sink):
    sink.step(step(0))
    sink.step(step(1, loss=None))  # a step whose loss was not read keeps the last one
    sink.epoch(RECORD, [RECORD])
    got = scrape(sink)
    assert got[key("hvdcls_steps_total")] == 2 and got[key("hvdcls_images_total")] == 128
    assert got[key("hvdcls_step_seconds_total")] == 1.0 and got[key("hvdcls_data_wait_seconds_total")] == 0.5
    assert got[key("hvdcls_last_step_seconds")] == 0.5 and got[key("hvdcls_last_data_wait_seconds")] == 0.25
    assert got[key("hvdcls_loss", split="train")] == 2.0 and got[key("hvdcls_loss", split="val")] == 0.9
    assert got[key("hvdcls_accuracy", split="val")] == 0.75
    assert got[key("hvdcls_images_per_second")] == 321.0  # the epoch's figure once it is done
    assert got[key("hvdcls_world_size")] == 2 and got[key("hvdcls_epoch")] == 1
    assert got[key("hvdcls_epochs")] == 3 and got[key("hvdcls_training_done")] == 0
    assert got[key("hvdcls_learning_rate")] == 0.1


def test_an_unmeasured_allreduce_is_absent_not_zero(sink):
    sink.step(step(0))
    names = {name for name, _ in scrape(sink)}
    assert not {"hvdcls_last_allreduce_wait_seconds", "hvdcls_allreduce_wait_seconds_total",
                "hvdcls_allreduce_share"} & names


def test_a_measured_allreduce_and_its_share(sink):
    sink.step(step(0, allreduce=0.15))
    got = scrape(sink)
    assert got[key("hvdcls_allreduce_wait_seconds_total")] == 0.15
    assert got[key("hvdcls_allreduce_share")] == pytest.approx(0.15 / 0.75)  # of step + data wait


def test_every_listed_metric_is_exposed_once_measured(sink):
    sink.step(step(0, allreduce=0.1))
    sink.epoch({**RECORD}, [RECORD])
    names = {name for name, _ in scrape(sink)}
    assert {"hvdcls_" + m[0] for m in METRICS} <= names


def test_a_busy_port_is_one_user_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}"):
            PrometheusSink(port, "127.0.0.1", LABELS)


def test_linger_ends_with_the_first_scrape_after_done(sink):
    sink.linger_seconds = 600
    finished = threading.Thread(target=sink.finish)
    finished.start()
    while not sink.state.done:  # finish() marks the run done before it waits
        time.sleep(0.01)
    assert scrape(sink)[key("hvdcls_training_done")] == 1
    finished.join(timeout=60)
    assert not finished.is_alive()


def test_the_balancing_plan_is_a_gauge_per_rank_and_absent_without_one(sink):
    assert not any(name.startswith("hvdcls_balance") for name, _ in scrape(sink))
    sink.balance([43, 21], [320.0, 160.0])
    got = scrape(sink)
    assert got[key("hvdcls_balance_batch", rank="0")] == 43 and got[key("hvdcls_balance_batch", rank="1")] == 21
    assert got[key("hvdcls_balance_speed", rank="1")] == 160.0
    sink.balance([32, 32], [])  # a fixed plan: batches, no measured speeds
    got = scrape(sink)
    assert got[key("hvdcls_balance_batch", rank="1")] == 32
    assert not any(name == "hvdcls_balance_speed" for name, _ in got)
