"""Models in and out, as a user goes: pretrain under horovodrun, fine-tune from the run
directory, evaluate, export every format, predict from the run and from the ONNX file. One
chain of real launches per backend (the fixture), its assertions spread over the tests below.

Two letter sets with disjoint classes (tests/image_tree.py): A-E to pretrain, F-J the task.
"""
import concurrent.futures
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdcls.launching import launch
from tests.image_tree import write_letters_imagefolder
from tests.parallel.test_train import NP, REPO
from tests.run_files import read_json

pytestmark = pytest.mark.parallel

FIRST, SECOND = "ABCDEF", "GHIJK"  # 6 and 5 classes: the head is replaced
SIZE = 16
FORMATS = {"torch": {"state-dict": "model.safetensors", "torchscript": "model.pt", "onnx": "model.onnx"},
           "tensorflow": {"keras": "model.keras", "savedmodel": "savedmodel", "onnx": "model.onnx"}}
TRAIN = ("--model", "compact_cnn", "--lr", "0.2", "-b", "16", "--quiet", f"data.image_size={SIZE}",
         "data.eval_crop=1.0", "training.stall_timeout_seconds=120")


def hvdcls(*args: str, cwd: Path, ranks: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    command = launch.hvdcls_command(*args)
    cmd, env = launch.local_job("horovodrun", ranks, command) if ranks > 1 else (command, launch.single_host_env())
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


def letter_sets(base: Path) -> tuple[Path, Path]:
    letters = write_letters_imagefolder(base / "letters", size=SIZE, variants=1)
    sets = []
    for name, classes in (("first", FIRST), ("second", SECOND)):
        for split in ("train", "val"):
            for letter in classes:
                shutil.copytree(letters / split / letter, base / name / split / letter)
        sets.append(base / name)
    return sets[0], sets[1]


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def chain(request, tmp_path_factory):
    """Every launch of the chain, for one backend: {name: CompletedProcess}, and the paths."""
    backend, base = request.param, tmp_path_factory.mktemp(f"models-{request.param}")
    first, second = letter_sets(base)
    bad = base / "photos"
    shutil.copytree(second / "val", bad)
    (bad / SECOND[0] / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    runs = {"pretrain": base / "pretrain", "finetune": base / "finetune"}
    out: dict = {"backend": backend, "base": base, "first": first, "second": second, "bad": bad, **runs}
    common = ("--backend", backend, *TRAIN)
    out["train_pretrain"] = ok(hvdcls("train", *common, "--data", str(first), "--epochs", "4",
                                      "--output-dir", str(runs["pretrain"]), "training.ema_decay=0.9",
                                      "training.ema_steps=1", cwd=base, ranks=NP))
    out["train_finetune"] = ok(hvdcls("train", *common, "--data", str(second), "--epochs", "3",
                                      "--output-dir", str(runs["finetune"]), f"model.weights={runs['pretrain']}",
                                      "data.sampler=balanced", cwd=base, ranks=NP))
    out["evaluate"] = ok(hvdcls("evaluate", str(runs["finetune"]), cwd=base))
    out["evaluate_ema"] = ok(hvdcls("evaluate", str(runs["pretrain"]), "--output-dir", str(base / "eval-ema"),
                                    cwd=base))
    for fmt, name in FORMATS[backend].items():
        out[f"export_{fmt}"] = ok(hvdcls("export", str(runs["finetune"]), "--format", fmt,
                                         "-o", str(base / "exports" / name), cwd=base))
    out["predict_run"] = hvdcls("predict", str(runs["finetune"]), str(bad), "-k", "3",
                                "-o", str(base / "run.csv"), cwd=base)
    out["predict_onnx"] = hvdcls("predict", str(base / "exports" / "model.onnx"), str(second / "val"),
                                 "-k", "3", cwd=base)
    return out


def rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_fine_tuning_starts_from_the_run_with_a_new_head_and_identical_ranks(chain):
    banner = next(line for line in chain["train_finetune"].stdout.splitlines() if " backend, " in line)
    assert f"the run {chain['pretrain']}" in banner and "head replaced" in banner, banner
    assert "preprocessing from the run" in banner, banner
    summary = read_json(chain["finetune"] / "summary.json")
    assert len(set(summary["rank_weight_digests"])) == 1
    card = read_json(chain["finetune"] / "model_card.json")
    assert card["class_names"] == list(SECOND) and card["weights"] == "model"


def test_evaluation_is_the_training_runs_own_figure_with_per_class_detail(chain):
    finetune, pretrain = chain["finetune"], chain["pretrain"]
    evaluation = read_json(finetune / "evaluation.json")
    summary = read_json(finetune / "summary.json")
    assert evaluation["weights"] == "model"
    assert evaluation["top1"] == pytest.approx(summary["val_accuracy"], abs=1e-9)
    assert evaluation["top5"] is None  # five classes: top-5 says nothing
    assert sorted(evaluation["per_class"]) == list(SECOND)
    matrix = evaluation["confusion_matrix"]
    assert len(matrix) == 5 and sum(map(sum, matrix)) == summary["data"]["val"]
    assert sum(matrix[i][i] for i in range(5)) / summary["data"]["val"] == pytest.approx(evaluation["top1"])
    assert (finetune / "confusion_matrix.csv").is_file() and (finetune / "confusion_matrix.png").stat().st_size > 1000
    ema = read_json(chain["base"] / "eval-ema" / "evaluation.json")  # the pretrained run kept an EMA
    assert ema["weights"] == "ema"
    assert ema["top1"] == pytest.approx(read_json(pretrain / "summary.json")["ema_val_accuracy"], abs=1e-9)


def test_every_export_is_written_and_checked(chain):
    for fmt, name in FORMATS[chain["backend"]].items():
        assert (chain["base"] / "exports" / name).exists(), fmt
        assert fmt in chain[f"export_{fmt}"].stdout
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(chain["base"] / "exports" / "model.onnx")).metadata_props}
    assert json.loads(meta["class_names"]) == list(SECOND)
    assert meta["layout"] == ("NCHW" if chain["backend"] == "torch" else "NHWC")
    assert int(meta["image_size"]) == SIZE and float(meta["crop_fraction"]) == 1.0


def test_predict_names_the_broken_image_and_agrees_with_evaluation(chain):
    result = chain["predict_run"]
    assert result.returncode == 1, result.stderr[-2000:]
    assert "broken.png" in result.stderr and "Traceback" not in result.stderr
    predicted = rows((chain["base"] / "run.csv").read_text())
    assert list(predicted[0]) == ["path", "class", "probability", "class_2", "probability_2",
                                  "class_3", "probability_3"]
    assert not any("broken.png" in r["path"] for r in predicted)
    right = sum(Path(r["path"]).parent.name == r["class"] for r in predicted)
    assert right / len(predicted) == pytest.approx(read_json(chain["finetune"] / "evaluation.json")["top1"])


def test_the_onnx_file_alone_predicts_what_the_framework_does(chain):
    result = ok(chain["predict_onnx"])
    from_onnx = {r["path"]: r["class"] for r in rows(result.stdout)}
    from_run = {r["path"]: r["class"] for r in rows((chain["base"] / "run.csv").read_text())}
    common = [p for p in from_onnx if p.replace(str(chain["second"] / "val"), str(chain["bad"])) in from_run]
    assert len(common) == len(from_onnx) > 0
    agree = sum(from_onnx[p] == from_run[p.replace(str(chain["second"] / "val"), str(chain["bad"]))] for p in common)
    assert agree == len(common)  # 100 %: the export is the model


def test_bad_inputs_end_with_one_line_and_status_2(chain):
    base, backend = chain["base"], chain["backend"]
    other = "torch" if backend == "tensorflow" else "tensorflow"
    commands = {
        "another architecture": ("train", "--backend", backend, *TRAIN, "--model",
                                 "resnet18" if backend == "torch" else "mobilenet_v2",
                                 "--data", str(chain["second"]), "--epochs", "1", "data.image_size=32",
                                 "--output-dir", str(base / "wrong"), f"model.weights={chain['pretrain']}"),
        "another backend's run": ("train", "--backend", other, *TRAIN, "--data", str(chain["second"]),
                                  "--epochs", "1", "--output-dir", str(base / "wrong2"),
                                  f"model.weights={chain['pretrain']}"),
        "classes that differ": ("evaluate", str(chain["finetune"]), "--data", str(chain["first"])),
        "an unknown format": ("export", str(chain["finetune"]), "--format", "tflite", "-o", str(base / "x")),
    }
    # two at a time: each is one process, most of it a framework's import on one core
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        cases = dict(zip(commands, pool.map(lambda args: hvdcls(*args, cwd=base), commands.values())))
    for name, result in cases.items():
        lines = [line for line in result.stderr.splitlines() if line.startswith("hvdcls: error:")]
        assert result.returncode == 2 and len(lines) == 1, (name, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, name
    assert not (base / "x").exists()
