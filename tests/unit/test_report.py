"""hvdcls.observe.report: report.png of one run and `hvdcls report` over several, from run directories
(tests/parallel/test_monitor.py draws them from real runs)."""
import json
import struct

import pytest

from hvdcls.cli import main
from hvdcls.errors import UserError
from hvdcls.observe import report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def epoch(n, allreduce_share=0.1):
    return {"epoch": n, "train_loss": 2.0 / n, "val_loss": 1.8 / n, "train_accuracy": 0.5 + n / 10,
            "val_accuracy": 0.55 + n / 10, "lr": 0.1, "images_per_sec": 900.0 + n, "world_size": 2,
            "data_wait_share": 0.05, "allreduce_share": allreduce_share, "epoch_seconds": 2.0,
            "train_seconds": 1.8, "steps": 10}


def make_run(directory, backend, share=0.1, epochs=3, summary=True):
    directory.mkdir(parents=True)
    lines = "".join(json.dumps(epoch(n, share)) + "\n" for n in range(1, epochs + 1))
    (directory / "metrics.jsonl").write_text(lines)
    if summary:
        (directory / "summary.json").write_text(json.dumps(
            {"backend": backend, "world_size": 2, "model": "compact_cnn", "images_per_sec": 905.5,
             "wall_seconds": 12.25, "config": {"horovod": {"timeline": None}}}))
    return directory


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_run_report_is_a_png_of_the_figure_size(tmp_path):
    run = make_run(tmp_path / "a", "torch")
    path = report.write_run_report(run, report.load_run(run).history)
    data = path.read_bytes()
    assert path == run / "report.png"
    assert png_size(data) == (1100, 750) and len(data) > 30_000
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # written atomically


def test_an_unmeasured_allreduce_is_said_on_the_picture(tmp_path):
    measured = report.render_run(report.load_run(make_run(tmp_path / "t", "torch")))
    unmeasured = report.render_run(report.load_run(make_run(tmp_path / "f", "tensorflow", share=None)))
    assert png_size(unmeasured) == png_size(measured) and unmeasured != measured


def test_comparison_png_and_markdown(tmp_path, capsys):
    runs = [make_run(tmp_path / "t", "torch"), make_run(tmp_path / "f", "tensorflow", share=None)]
    output = tmp_path / "out" / "compare.png"
    assert main(["report", *map(str, runs), "-o", str(output)]) == 0
    assert png_size(output.read_bytes()) == (1100, 750)
    table = output.with_suffix(".md").read_text()
    assert table in capsys.readouterr().out
    header, rule, torch_row, tf_row = table.splitlines()
    assert header.count("|") == rule.count("|") == torch_row.count("|") == 13
    assert torch_row.startswith("| torch np=2 | torch | 2 | compact_cnn | 3 | 0.8500 | 0.8500 | 905.5 | 5.0 | 10.0 |")
    assert tf_row.split(" | ")[9] == "n/a"


def test_a_running_run_without_summary_and_same_labels(tmp_path):
    runs = [report.load_run(make_run(tmp_path / "x", "torch")),
            report.load_run(make_run(tmp_path / "y", "torch")),
            report.load_run(make_run(tmp_path / "live", "torch", summary=False))]
    assert report.unique_labels(runs[:2]) == ["torch np=2 (x)", "torch np=2 (y)"]
    assert runs[2].label == "live np=2" and report.images_per_sec(runs[2]) == pytest.approx(902.0)
    assert png_size(report.render_comparison(runs)) == (1100, 750)


def test_user_errors(tmp_path, capsys):
    with pytest.raises(UserError, match="not a run directory"):
        report.load_run(tmp_path)
    run = make_run(tmp_path / "a", "torch")
    assert main(["report", str(run), "-o", str(tmp_path / "table.md")]) == 2
    assert capsys.readouterr().err.startswith("hvdcls: error: --output")
    assert main(["report", str(tmp_path / "missing")]) == 2


def balanced_run(directory, plans_in_summary):
    """A 3-epoch run of 10 steps per epoch under balance=dynamic: equal 16/16 at first, 24/8
    from step 6, 22/10 from step 14 (what metrics.jsonl holds at each epoch's end, and
    summary.json's plans with the steps they started at)."""
    plans = [{"step": 0, "batches": [16, 16], "speeds": None},
             {"step": 6, "batches": [24, 8], "speeds": [300.0, 100.0]},
             {"step": 14, "batches": [22, 10], "speeds": [280.0, 130.0]}]
    make_run(directory, "torch", summary=False)
    at_end = [plans[1], plans[2], plans[2]]
    records = [{**epoch(n), "balance_batches": p["batches"], "balance_speeds": p["speeds"]}
               for n, p in zip((1, 2, 3), at_end)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if plans_in_summary:
        (directory / "summary.json").write_text(json.dumps(
            {"backend": "torch", "world_size": 2, "balance": {"mode": "dynamic", "plans": plans}}))
    return report.load_run(directory)


def drawn_lines(axis):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axis.get_lines()}


def test_the_balancing_plan_is_drawn_per_rank(tmp_path):
    """Balanced runs get a third row: each rank's batch (a step line) and measured speed, from
    summary.json's plans once the run has ended, from metrics.jsonl's epoch ends before."""
    from matplotlib.figure import Figure

    ended = balanced_run(tmp_path / "ended", plans_in_summary=True)
    running = balanced_run(tmp_path / "running", plans_in_summary=False)
    plain = report.load_run(make_run(tmp_path / "off", "torch"))
    assert report.balance_plans(plain) == []
    assert [(p.at, p.batches, p.speeds) for p in report.balance_plans(ended)] == [
        (0.0, (16, 16), None), (0.6, (24, 8), (300.0, 100.0)), (1.4, (22, 10), (280.0, 130.0))]
    assert [p.at for p in report.balance_plans(running)] == [1.0, 2.0, 3.0]

    batch, speed = Figure().subplots(1, 2)
    report.draw_balance((batch, speed), report.balance_plans(ended), end=3.0)
    batches, speeds = drawn_lines(batch), drawn_lines(speed)
    # each plan holds until the next one, the last to the end of the run
    assert batches["rank 0"] == ([0.0, 0.6, 1.4, 3.0], [16, 24, 22, 22])
    assert batches["rank 1"] == ([0.0, 0.6, 1.4, 3.0], [16, 8, 10, 10])
    assert speeds["rank 1"] == ([0.6, 1.4], [100.0, 130.0])  # the equal start was not measured

    assert png_size(report.render_run(running)) == (1100, 1050)  # a third row (plain: 1100 x 750)


def test_the_last_validations_confusion_matrix_joins_the_report(tmp_path):
    """A run that wrote evaluation.json (its last validation) gets a row more: the matrix and
    F1 by class; one of more classes than the report shows keeps the plain figure."""
    from hvdcls.observe.classification import RunningMetrics, write_outputs

    run = make_run(tmp_path / "run", "torch")
    metrics = RunningMetrics.from_counts([[3, 1, 0], [0, 4, 0], [1, 0, 2]], None)
    names = ["cat", "dog", "fox"]
    write_outputs(run, {**metrics.result(names), "class_names": names, "weights": "ema", "epoch": 3})
    width, height = png_size(report.render_run(report.load_run(run)))
    assert (width, height) == (int(report.FIGURE_INCHES[0] * report.DPI),
                               int((report.FIGURE_INCHES[1] + report.ROW_INCHES) * report.DPI))
    assert (run / "confusion_matrix.csv").read_text().splitlines()[1] == "cat,3,1,0"
    many = [f"c{i}" for i in range(report.CONFUSION_CLASSES + 1)]
    big = RunningMetrics(len(many))
    write_outputs(run, {**big.result(many), "class_names": many, "weights": "model"})
    assert png_size(report.render_run(report.load_run(run)))[1] == int(report.FIGURE_INCHES[1] * report.DPI)
