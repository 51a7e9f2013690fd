"""The Python half of tools/gpu_check.sh: each step's JSON record, the summary table, and two
small probes run inside the step environment.

    python tools/gpu_check.py record STEP --out OUT --work WORK --mode gpu --rc 0 --seconds 12.3 --log L
    python tools/gpu_check.py record STEP --out OUT --work WORK --mode gpu --previous FIRST/STEP.json
    python tools/gpu_check.py summarize --out OUT --mode gpu [--table F]  # summary.json (+ .md)
    python tools/gpu_check.py passed FIRST/STEP.json             # exit 0 when that step was ok
    python tools/gpu_check.py built --work WORK [--wheel W --out OUT [--previous FIRST/build.json]]
    python tools/gpu_check.py imports --out F                    # what the step environment imports
    python tools/gpu_check.py probe --device cuda --out F        # one Horovod all-reduce on the device

A step is ok when its command exited 0 AND what it wrote says it worked (train: validation
accuracy >= 0.95; bench: all three runners measured; ...). `record` always writes the step's
JSON, also for a failed or timed-out step (with the log's tail), so the summary names what broke.
Standard library only at import time: `record` and `summarize` run with any python3.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

STEPS = ("build", "install", "smoke", "train", "bench", "pipeline")
ACCURACY_BAR = 0.95  # the digits demo's bar
HVDCLS_VS_TORCH_TARGET = 0.97  # issue 15: hvdcls's step >= 0.97x the plain torch loop
A100_RESNET50_AMP = 2470.0  # NVIDIA DeepLearningExamples, PyTorch ResNet-50 AMP, one A100 (img/s)
LOG_TAIL_LINES = 25
RETURNED_FILE_LIMIT = 16 * 2**20  # the device tool brings back files up to 16 MiB


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, obj, sort_keys: bool = True) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n")
    tmp.replace(path)


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    if path is None:
        return []
    try:
        return Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


# Each extractor reads what its step left in WORK: (results, problems). No problems = it worked.

def extract_build(work: Path, mode: str) -> tuple[dict, list[str]]:
    info = read_json(work / "build.json") or {}
    problems = [] if info.get("horovod") else ["no Horovod wheel was built or found"]
    return info, problems


def nccl_expected(work: Path, mode: str) -> bool:
    """The GPU mode, or a CPU run of its build (HOROVOD_BUILD=nccl, the rehearsal)."""
    inputs = (read_json(work / "build.json") or {}).get("inputs") or {}
    return mode == "gpu" or inputs.get("gpu_operations") == "NCCL"


def modules_ok(found: dict, name: str) -> bool:
    return bool(found.get("modules", {}).get(name))


def extract_install(work: Path, mode: str) -> tuple[dict, list[str]]:
    found = read_json(work / "imports.json")
    if found is None:
        return {}, ["the import check wrote nothing"]
    problems = [f"cannot import {name}" for name, version in found["modules"].items() if not version]
    if nccl_expected(work, mode) and modules_ok(found, "horovod") and not found.get("nccl_built"):
        problems.append("Horovod was built without NCCL")
    if mode == "gpu" and not found.get("cuda_available"):
        problems.append("torch sees no CUDA device")
    return found, problems


def extract_smoke(work: Path, mode: str) -> tuple[dict, list[str]]:
    report = read_json(work / "smoke" / "rank-0.json")
    probe = read_json(work / "probe.json")
    problems = []
    if report is None:
        problems.append("hvdcls smoke wrote no rank-0.json")
    elif not report.get("passed"):
        problems += [f"smoke check failed: {c['name']}" for c in report["checks"] if not c["ok"]]
    if probe is None:
        problems.append("the device all-reduce probe wrote nothing")
    elif not probe.get("ok"):
        problems.append(f"device all-reduce gave {probe.get('result')}, expected {probe.get('expected')}")
    results = {"smoke_checks": None if report is None else
               f"{sum(c['ok'] for c in report['checks'])}/{len(report['checks'])}",
               "controller": (report or {}).get("controller"), "probe": probe}
    return results, problems


def extract_train(work: Path, mode: str) -> tuple[dict, list[str]]:
    summary = read_json(work / "train" / "summary.json")
    if summary is None:
        return {}, ["hvdcls train wrote no summary.json"]
    results = {key: summary.get(key) for key in
               ("val_accuracy", "best_val_accuracy", "images_per_sec", "wall_seconds", "world_size")}
    results["device"] = summary.get("device") or (summary.get("config") or {}).get("training", {}).get("device")
    results["amp"] = (summary.get("config") or {}).get("training", {}).get("amp")
    accuracy = summary.get("val_accuracy") or 0.0
    problems = [] if accuracy >= ACCURACY_BAR else [f"val accuracy {accuracy:.4f} < {ACCURACY_BAR}"]
    return results, problems


def extract_bench(work: Path, mode: str) -> tuple[dict, list[str]]:
    report = read_json(work / "bench" / "bench.json")
    if report is None:
        return {}, ["hvdcls bench wrote no bench.json"]
    runners, problems = {}, []
    for cell in report["cells"]:
        if "error" in cell:
            problems.append(f"{cell['runner']}: {cell['error'][:300]}")
        else:
            runners[cell["runner"]] = {"images_per_sec": cell["images_per_sec"]["median"],
                                       "min": cell["images_per_sec"]["min"],
                                       "max": cell["images_per_sec"]["max"],
                                       "step_seconds": cell["step_seconds"]["median"]}
    problems += [f"no {name} result" for name in ("hvdcls", "raw-horovod", "ddp")
                 if name not in runners and not any(p.startswith(name + ":") for p in problems)]
    rate = {name: r["images_per_sec"] for name, r in runners.items()}
    spec = report["spec"]
    results = {"model": spec["models"][0], "image_size": spec["image_size"],
               "batch_size": spec["batch_sizes"][0], "device": spec["device"], "runners": runners,
               "hvdcls_vs_torch": ratio(rate.get("hvdcls"), rate.get("ddp")),
               "hvdcls_vs_raw_horovod": ratio(rate.get("hvdcls"), rate.get("raw-horovod")),
               "raw_horovod_vs_torch": ratio(rate.get("raw-horovod"), rate.get("ddp")),
               "machine": report.get("machine")}
    return results, problems


def extract_pipeline(work: Path, mode: str) -> tuple[dict, list[str]]:
    results, problems = {}, []
    for loader in ("hvdcls", "torchvision"):
        found = read_json(work / f"pipeline-{loader}.json")
        if found is None:
            problems.append(f"the {loader} loader wrote nothing")
        elif not found["images_per_sec"] > 0:
            problems.append(f"the {loader} loader read no images")
        else:
            results[loader] = found
    return results, problems


EXTRACTORS = {"build": extract_build, "install": extract_install, "smoke": extract_smoke,
              "train": extract_train, "bench": extract_bench, "pipeline": extract_pipeline}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def record(step: str, work: Path, mode: str, rc: int, seconds: float, log: Path | None,
           skipped: str = "", cpu_seconds: float | None = None) -> dict:
    """The step's JSON: ok only when the command exited 0 and its outputs say it worked."""
    if skipped:
        results: dict = {}
        problems = [f"skipped: {skipped}"]
    else:
        results, problems = EXTRACTORS[step](work, mode)
        if rc != 0:
            problems.insert(0, "timed out" if rc in (124, 137) else f"exit {rc}")
    out = {"step": step, "mode": mode, "ok": not problems, "rc": rc, "seconds": round(seconds, 1),
           "timed_out": rc in (124, 137), "problems": problems, "results": results}
    if cpu_seconds is not None:
        out["cpu_seconds"] = cpu_seconds
    if problems and not skipped:
        out["log_tail"] = log_tail(log)
    return out


def passed(path: Path) -> bool:
    """Whether a step record (a first try's, brought back) says the step worked."""
    return bool((read_json(path) or {}).get("ok"))


def carried_over(path: Path) -> dict:
    """A first try's record of a step that passed, for the second try's OUT, marked as such."""
    return {**(read_json(path) or {}), "previous": True}


def built(work: Path, wheel: Path | None = None, out: Path | None = None,
          previous: Path | None = None) -> dict:
    """WORK/build.json for the build step: the installed Horovod's version when no wheel was
    built (HOROVOD_BUILD=reuse), else the wheel's build-info (or the first try's, for its wheel),
    the wheel copied into OUT when it fits what a device run brings back."""
    if wheel is None:
        from importlib import metadata

        info: dict = {"horovod": metadata.version("horovod"), "reused": True}
    elif previous is not None:
        first = (read_json(previous) or {}).get("results") or {}
        info = {**first, "reused": "first try", "wheel": wheel.name}
    else:
        made = json.loads((wheel.parent / "build-info.json").read_text())
        info = {"horovod": made["inputs"]["horovod"], "reused": False, "wheel": wheel.name,
                "wheel_mb": round(wheel.stat().st_size / 2**20, 1),
                "build_seconds": made["build_seconds"], "inputs": made["inputs"]}
    if wheel is not None and out is not None and previous is None:
        info["wheel_in_out"] = wheel.stat().st_size <= RETURNED_FILE_LIMIT
        if info["wheel_in_out"]:
            shutil.copyfile(wheel, out / wheel.name)
    write_json(work / "build.json", info)
    return info


def fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def headline(step: dict) -> str:
    """The one line of a step's result that goes into the table."""
    if step.get("previous"):
        return headline({**step, "previous": False}) + " (first try)"
    r = step["results"]
    if not step["ok"]:
        return "; ".join(step["problems"])[:200]
    if step["step"] == "build":
        how = {True: "reused the installed Horovod", "first try": "the first try's wheel",
               False: f"built in {fmt(r.get('build_seconds'))} s"}[r.get("reused", False)]
        return f"Horovod {r['horovod']}, {how}"
    if step["step"] == "install":
        return (f"torch {r['modules'].get('torch')}, Horovod {r['modules'].get('horovod')}, "
                f"NCCL {'yes' if r.get('nccl_built') else 'no'}, GPU {r.get('gpu') or 'none'}, "
                f"carried: {', '.join(r.get('carried') or []) or 'none'}")
    if step["step"] == "smoke":
        probe = r["probe"] or {}
        return f"{r['smoke_checks']} checks ({r['controller']}); all-reduce on {probe.get('device')} ok"
    if step["step"] == "train":
        return (f"digits on {r['device']}: val accuracy {fmt(r['val_accuracy'], 4)}, "
                f"{fmt(r['images_per_sec'])} img/s, {fmt(r['wall_seconds'])} s")
    if step["step"] == "bench":
        rates = ", ".join(f"{name} {fmt(v['images_per_sec'])}" for name, v in r["runners"].items())
        return (f"{r['model']} {r['image_size']} px batch {r['batch_size']} img/s: {rates}; "
                f"hvdcls/torch {fmt(r['hvdcls_vs_torch'], 3)}")
    if step["step"] == "pipeline":
        return "; ".join(f"{name} {fmt(v['images_per_sec'])} img/s with {v['workers']} workers "
                         f"({fmt(v['images_per_sec_per_worker'])}/core)" for name, v in r.items())
    return ""


def targets(steps: dict[str, dict], mode: str) -> list[dict]:
    """Issue 15's targets, each met, not met or not measured (None)."""
    bench = steps.get("bench", {}).get("results") or {}
    runners = bench.get("runners") or {}
    hvdcls_rate = (runners.get("hvdcls") or {}).get("images_per_sec")
    vs_torch = bench.get("hvdcls_vs_torch")
    pipeline = steps.get("pipeline", {}).get("results") or {}
    out = [{"target": f"hvdcls step >= {HVDCLS_VS_TORCH_TARGET}x the plain torch loop",
            "value": vs_torch, "met": None if vs_torch is None else vs_torch >= HVDCLS_VS_TORCH_TARGET}]
    a100 = {"target": f"ResNet-50 AMP above one A100's {A100_RESNET50_AMP:,.0f} img/s", "value": None,
            "met": None}
    if mode == "gpu" and hvdcls_rate and bench.get("model") == "resnet50":  # else not comparable
        a100.update(value=hvdcls_rate, met=hvdcls_rate > A100_RESNET50_AMP)
    out.append(a100)
    for name in ("hvdcls", "torchvision"):
        per_core = (pipeline.get(name) or {}).get("images_per_sec_per_worker")
        cores = hvdcls_rate / per_core if hvdcls_rate and per_core else None
        out.append({"target": f"cores for the {name} loader to feed the measured GPU rate",
                    "value": cores, "met": None, "per_core": per_core})
    return out


def summarize(out_dir: Path, mode: str, table: Path | None = None) -> dict:
    """OUT/summary.json and the table (default OUT/summary.md). Its seconds are this try's: a
    step carried over from the first try (PREVIOUS) counts none."""
    steps = {name: read_json(out_dir / f"{name}.json") or
             {"step": name, "ok": False, "seconds": None, "problems": ["no result (the script stopped?)"],
              "results": {}} for name in STEPS}
    summary = {"mode": mode, "ok": all(s["ok"] for s in steps.values()),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "host": {"cores": os.cpu_count(), "python": sys.version.split()[0],
                        **{k: v for k, v in (steps["install"].get("results") or {}).items()
                           if k in ("gpu", "torch_cuda", "modules")}},
               "seconds": round(sum(s["seconds"] or 0 for s in steps.values() if not s.get("previous")), 1),
               "steps": {name: {"ok": s["ok"], "seconds": s["seconds"], "cpu_seconds": s.get("cpu_seconds"),
                                "previous": bool(s.get("previous")), "result": headline(s)}
                         for name, s in steps.items()},
               "targets": targets(steps, mode)}
    write_json(out_dir / "summary.json", summary, sort_keys=False)  # the steps in their order
    (table or out_dir / "summary.md").write_text(markdown(summary))
    return summary


def markdown(summary: dict) -> str:
    host = summary.get("host") or {}
    lines = [f"# GPU check ({summary['mode']} mode): {'all steps ok' if summary['ok'] else 'FAILED'}, "
             f"{fmt(summary['seconds'])} s of steps", "",
             f"{summary.get('date', '')}; {host.get('gpu') or 'no GPU'}, {host.get('cores')} cores, "
             f"Python {host.get('python')}, CUDA {host.get('torch_cuda') or '–'}, "
             + ", ".join(f"{k} {v}" for k, v in (host.get("modules") or {}).items()), "",
             "| step | ok | seconds | result |", "| --- | --- | --- | --- |"]
    for name, step in summary["steps"].items():
        result = step["result"].replace("|", "/")
        lines.append(f"| {name} | {'ok' if step['ok'] else 'FAILED'} | {fmt(step['seconds'])} | {result} |")
    lines += ["", "| target | value | met |", "| --- | --- | --- |"]
    for target in summary["targets"]:
        met = {True: "yes", False: "no", None: "–"}[target["met"]]
        value = target["value"]
        lines.append(f"| {target['target']} | {fmt(value, 3 if value is not None and value < 10 else 1)} | {met} |")
    return "\n".join(lines) + "\n"


def imports(out: Path, carried_dir: Path | None) -> int:
    """What the step environment imports, and which Horovod it is (run with PYTHONPATH set)."""
    from importlib import metadata, util

    modules = {}
    for name in ("torch", "torchvision", "horovod", "omegaconf", "hvdcls"):
        try:
            modules[name] = metadata.version(name) if util.find_spec(name) else ""
        except metadata.PackageNotFoundError:
            modules[name] = "source tree" if name == "hvdcls" else "?"
    found: dict = {"modules": modules, "python": sys.version.split()[0]}
    # torch first and on its own: a Horovod that failed to build must not hide the GPU.
    try:
        import torch

        found.update(cuda_available=torch.cuda.is_available(), torch_cuda=torch.version.cuda,
                     gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except Exception as err:
        found["torch_error"] = f"{type(err).__name__}: {err}"
    try:
        import horovod.torch as hvd

        found.update(nccl_built=bool(hvd.nccl_built()), gloo_built=bool(hvd.gloo_built()),
                     mpi_built=bool(hvd.mpi_built()), horovod_path=str(Path(hvd.__file__).parent.parent))
    except Exception as err:
        modules["horovod"] = ""
        found["error"] = f"{type(err).__name__}: {err}"
    if carried_dir is not None:
        found["carried"] = sorted(p.name.split("-")[0] for p in carried_dir.glob("*.whl"))
    write_json(out, found)
    return 0


def probe(device: str, out: Path) -> int:
    """One all-reduce of a tensor on `device` through horovod.torch (NCCL for cuda tensors when
    Horovod was built with it), checked against the expected sum."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    target = torch.device("cuda", hvd.local_rank()) if device == "cuda" else torch.device("cpu")
    tensor = torch.full((1024,), float(hvd.rank() + 1), device=target)
    summed = hvd.allreduce(tensor, op=hvd.Sum, name="gpu_check.probe")
    expected = hvd.size() * (hvd.size() + 1) / 2
    result = float(summed.max().item())
    if hvd.rank() == 0:
        write_json(out, {"device": str(target), "size": hvd.size(), "result": result,
                         "expected": expected, "ok": result == expected == float(summed.min().item()),
                         "nccl_built": bool(hvd.nccl_built())})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("step", choices=STEPS)
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--work", type=Path, required=True)
    rec.add_argument("--mode", choices=["gpu", "cpu"], required=True)
    rec.add_argument("--rc", type=int, default=0)
    rec.add_argument("--seconds", type=float, default=0.0)
    rec.add_argument("--log", type=Path)
    rec.add_argument("--skipped", default="", help="why the step did not run")
    rec.add_argument("--cpu-seconds", type=float, help="CPU seconds of the step's processes")
    rec.add_argument("--previous", type=Path, help="the first try's record of a step that passed")
    summ = sub.add_parser("summarize")
    summ.add_argument("--out", type=Path, required=True)
    summ.add_argument("--mode", choices=["gpu", "cpu"], required=True)
    summ.add_argument("--table", type=Path, help="where summary.md goes (default: OUT)")
    pas = sub.add_parser("passed")
    pas.add_argument("record", type=Path)
    bui = sub.add_parser("built")
    bui.add_argument("--work", type=Path, required=True)
    bui.add_argument("--wheel", type=Path)
    bui.add_argument("--out", type=Path)
    bui.add_argument("--previous", type=Path, help="the first try's build.json (its wheel reused)")
    imp = sub.add_parser("imports")
    imp.add_argument("--out", type=Path, required=True)
    imp.add_argument("--carried", type=Path)
    pro = sub.add_parser("probe")
    pro.add_argument("--device", choices=["cpu", "cuda"], required=True)
    pro.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "record":
        step = carried_over(args.previous) if args.previous else record(
            args.step, args.work, args.mode, args.rc, args.seconds, args.log, args.skipped, args.cpu_seconds)
        write_json(args.out / f"{args.step}.json", step)
        print(f"[gpu_check] {args.step}: {'ok' if step['ok'] else 'FAILED'} in {step['seconds']} s"
              + ("" if step["ok"] else f" ({'; '.join(step['problems'])[:300]})"), flush=True)
        return 0
    if args.command == "summarize":
        summary = summarize(args.out, args.mode, args.table)
        print((args.table or args.out / "summary.md").read_text(), flush=True)
        return 0 if summary["ok"] else 1
    if args.command == "passed":
        return 0 if passed(args.record) else 1
    if args.command == "built":
        built(args.work, args.wheel, args.out, args.previous)
        return 0
    if args.command == "imports":
        return imports(args.out, args.carried)
    return probe(args.device, args.out)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
