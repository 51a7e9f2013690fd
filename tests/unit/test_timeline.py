"""hvdcls.observe.timeline on small hand-written traces shaped like Horovod's (tests/parallel/test_monitor.py
checks a real one): streaming, unterminated files, pairing, merged rounds, fused bytes."""
import json

import pytest

from hvdcls.cli import main
from hvdcls.errors import UserError
from hvdcls.observe import timeline


def tensor(pid: int, name: str) -> list[dict]:
    return [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]


def span(pid: int, name: str, start: int, end: int, inner=(), args=None) -> list[dict]:
    events = [{"ph": "B", "name": name, "ts": start, "pid": pid}]
    for inner_name, inner_start, inner_end in inner:
        events += [{"ph": "B", "name": inner_name, "ts": inner_start, "pid": pid},
                   {"ph": "E", "ts": inner_end, "pid": pid}]
    closing = {"ph": "E", "ts": end, "pid": pid}
    if args:
        closing["args"] = args
    return events + [closing]


FUSED = (("MEMCPY_IN_FUSION_BUFFER", 1010, 1020), ("GLOO_ALLREDUCE", 1020, 1900))


def trace_events() -> list[dict]:
    """Two gradients fused into one all-reduce round (1000-2000 us), then one alone
    (3000-3500 us); negotiation spans before each; 4,000 us traced in all."""
    return [*tensor(1, "allreduce.w"), *tensor(2, "allreduce.b"), *tensor(3, "allreduce.metrics"),
            *span(1, "NEGOTIATE_ALLREDUCE", 0, 900), *span(2, "NEGOTIATE_ALLREDUCE", 100, 950),
            *span(1, "ALLREDUCE", 1000, 2000, FUSED, {"dtype": "float32", "shape": "[32, 3, 3, 3]"}),
            *span(2, "ALLREDUCE", 1005, 1990, FUSED, {"dtype": "float32", "shape": "[32]"}),
            *span(3, "NEGOTIATE_ALLREDUCE", 2500, 2900),
            *span(3, "ALLREDUCE", 3000, 3500, [("GLOO_ALLREDUCE", 3010, 3490)],
                  {"dtype": "float64", "shape": "[3]"}),
            {"ph": "X", "name": "0", "ts": 4000, "pid": 3, "dur": 0}]


def write_trace(path, events, closed=True, cut=0) -> None:
    """Horovod's layout: '[' then one event per line with trailing commas; closed or not."""
    text = "[\n" + "".join(json.dumps(e) + ",\n" for e in events)
    text = text.rstrip(",\n") + "\n]\n" if closed else text
    path.write_text(text[: len(text) - cut] if cut else text)


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "timeline.json"
    write_trace(path, trace_events())
    return path


def test_numbers_of_a_small_trace(trace):
    s = timeline.summarize(trace)
    assert s.complete and s.unparsed_chars == 0
    assert s.tensors == 3 and s.traced_seconds == pytest.approx(0.004)
    assert s.ops["ALLREDUCE"]["count"] == 3
    assert s.ops["ALLREDUCE"]["seconds"] == pytest.approx((1000 + 985 + 500) / 1e6)
    assert s.ops["ALLREDUCE"]["bytes"] == 32 * 27 * 4 + 32 * 4 + 3 * 8
    assert s.ops["NEGOTIATE_ALLREDUCE"]["count"] == 3
    assert s.ops["GLOO_ALLREDUCE"]["count"] == 3
    assert s.rounds == 2  # the fused pair overlaps: one round; the metrics tensor another
    assert s.communication_seconds == pytest.approx((1000 + 500) / 1e6)
    assert s.communication_share == pytest.approx(1500 / 4000)
    assert s.seconds_per_round == pytest.approx(750 / 1e6)
    assert s.negotiation_seconds == pytest.approx((950 + 400) / 1e6)
    assert (s.fused_tensors, s.fused_bytes) == (2, 32 * 27 * 4 + 32 * 4)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_chunk_boundaries_do_not_matter(trace, chunk):
    assert timeline.summarize(trace, chunk_chars=chunk) == timeline.summarize(trace)


def test_an_unterminated_trace_is_read_whole(tmp_path, trace):
    running = tmp_path / "running.json"
    write_trace(running, trace_events(), closed=False)
    s, whole = timeline.summarize(running), timeline.summarize(trace)
    assert not s.complete and s.unparsed_chars == 0
    assert (s.events, s.ops, s.rounds) == (whole.events, whole.ops, whole.rounds)


def test_an_event_cut_in_half_is_left_out(tmp_path, trace):
    cut = tmp_path / "cut.json"
    write_trace(cut, trace_events(), closed=False, cut=12)  # the last event loses its end
    s = timeline.summarize(cut)
    assert not s.complete and 0 < s.unparsed_chars < 100
    assert s.events == timeline.summarize(trace).events - 1


def test_single_line_trace_and_a_dangling_begin(tmp_path):
    path = tmp_path / "one_line.json"
    events = trace_events() + [{"ph": "B", "name": "ALLREDUCE", "ts": 5000, "pid": 1}]
    path.write_text(json.dumps(events))  # no newlines at all; the last span never closes
    s = timeline.summarize(path)
    assert s.complete and s.rounds == 2 and s.ops["ALLREDUCE"]["count"] == 3


def test_merged_spans():
    assert timeline.merged_spans([], []) == (0, 0.0)
    assert timeline.merged_spans([5, 0, 1, 10], [6, 2, 3, 12]) == (3, 3 + 1 + 2)
    assert timeline.merged_spans([0, 1, 2], [10, 3, 4]) == (1, 10)


@pytest.mark.parametrize("args, size", [({"dtype": "float32", "shape": "[32, 3, 3, 3]"}, 3456),
                                        ({"dtype": "int64", "shape": "[]"}, 8),
                                        ({"dtype": "float16", "shape": "[10]"}, 20)])
def test_tensor_bytes(args, size):
    assert timeline.tensor_bytes(args) == size


def test_missing_and_empty_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        timeline.summarize(tmp_path / "nope.json")
    (tmp_path / "empty.json").write_text("[\n")
    with pytest.raises(UserError, match="no timeline events"):
        timeline.summarize(tmp_path / "empty.json")


def test_cli_prints_the_table_and_json(trace, capsys):
    assert main(["timeline", str(trace)]) == 0
    text = capsys.readouterr().out
    assert "collective rounds:   2" in text and "37.5 %" in text and "ALLREDUCE" in text
    assert main(["timeline", str(trace), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rounds"] == 2
    assert main(["timeline", str(trace.parent / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("hvdcls: error: timeline")
