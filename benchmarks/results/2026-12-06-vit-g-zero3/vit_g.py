"""Issue 49's first target: ViT-g/14 (1.01 B parameters) trains three AdamW steps at np=2 with
training.zero=3 and activation checkpointing on this 24 GB machine, writes a sharded checkpoint
and resumes from it, under a memory cgroup of the machine's memory less 1.5 GB.

At a size a CPU run can take: 56 px images, patch 14 (16 patches and the class token), a 4-image
ImageFolder (2 classes), batch 2 per rank, so one step an epoch: `--epochs 3` is three steps
(a checkpoint after each), then `--epochs 4 --resume` takes the fourth from the third's
checkpoint. The sampling and the cgroup are ../2026-12-03-vit-memory/vit_mem.py's.

    VIT_ROOT=/work/runs/vitg python benchmarks/results/2026-12-06-vit-g-zero3/vit_g.py [torch|tensorflow ...]

(as root, from the repository root, with the venv's bin first on PATH). One JSON per run and
phase in VIT_ROOT, a line each on stdout. For a diagnosis: VIT_MODEL (another ViT, e.g.
vit_l_16), VIT_PHASES ("resumed" alone), VIT_EXTRA (more config settings).
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("vit_mem", HERE.parent / "2026-12-03-vit-memory" / "vit_mem.py")
vit_mem = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vit_mem)

MODEL, SIZE, PATCH = os.environ.get("VIT_MODEL", "vit_g_14"), 56, 14


def sampled(cmd: list[str], out: Path) -> dict:
    """Run `cmd` in the cgroup, sampling the ranks' RSS and the cgroup every 0.2 s."""
    cg = vit_mem.CG
    peak, samples, started = 0, [], time.time()
    log = open(vit_mem.ROOT / f"{out.name}.log", "a")  # noqa: SIM115 (the child writes it)
    proc = subprocess.Popen(["bash", "-c", f'echo $$ > {cg}/tasks; exec "$@"', "x", *cmd],
                            stdout=log, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        rss = 0
        for p in vit_mem.ranks():
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        peak = max(peak, rss)
        samples.append((round(time.time() - started, 1), rss, *vit_mem.cgroup_stat(), vit_mem.phase(out)))
        time.sleep(0.2)
    max_usage = int((cg / "memory.max_usage_in_bytes").read_text())
    (cg / "memory.max_usage_in_bytes").write_text("0")
    return {"rc": proc.returncode, "seconds": round(time.time() - started, 1),
            "ranks_peak_rss_gb": round(peak / 2**30, 2), "cgroup_max_usage_gb": round(max_usage / 2**30, 2),
            "samples": samples}


def run(backend: str) -> None:
    data = vit_mem.make_data(SIZE)
    out = vit_mem.ROOT / f"{backend}-{MODEL}-z3"
    limit = int(os.environ.get("VIT_LIMIT_BYTES") or psutil.virtual_memory().total - int(1.5 * 2**30))
    vit_mem.CG.mkdir(exist_ok=True)
    (vit_mem.CG / "memory.limit_in_bytes").write_text(str(limit))
    base = [os.environ.get("VIT_LAUNCHER", "hvdcls-horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2",
            "hvdcls", "train", "--backend", backend, "--data", str(data), "--model", MODEL, "-b", "2",
            "--lr", "0.001", "--quiet", "--output-dir", str(out), "optimizer.name=adamw",
            f"data.image_size={SIZE}", f"model.patch_size={PATCH}", "training.zero=3",
            "training.activation_checkpointing=true", "data.workers=0", "output.report=false",
            "output.tensorboard=false", "output.checkpoint_every=3", "output.keep_checkpoints=1",
            *os.environ.get("VIT_EXTRA", "").split()]  # more settings, for a diagnosis
    phases = (("three-steps", ["--epochs", "3"]), ("resumed", ["--epochs", "4", "--resume", str(out)]))
    wanted = os.environ.get("VIT_PHASES", "three-steps resumed").split()  # "resumed": from the last run's
    for phase, extra in (p for p in phases if p[0] in wanted):
        row = {"backend": backend, "model": MODEL, "image_size": SIZE, "patch": PATCH, "phase": phase,
               "cgroup_limit_gb": round(limit / 2**30, 2), **sampled(base + extra, out)}
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
        row.update(memory=summary.get("memory"), rank_memory=summary.get("rank_memory"),
                   parameters=(summary.get("model_info") or {}).get("parameters"),
                   digests=summary.get("rank_weight_digests"),
                   history=[(r.get("epoch"), r.get("train_loss")) for r in summary.get("history", [])])
        (vit_mem.ROOT / f"{backend}-{MODEL}-{phase}.json").write_text(json.dumps(row))
        print(json.dumps({k: v for k, v in row.items() if k != "samples"}), flush=True)
        if row["rc"] != 0:
            break


if __name__ == "__main__":
    vit_mem.ROOT.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[1:] or ["torch"]:
        run(name)
