"""Issue 28: the largest ViT that trains one AdamW step at np=2 on this machine, with and
without zero=2 + activation checkpointing. Each run: a 2-rank hvdcls train over a 4-image
ImageFolder (one step an epoch at batch 2 per rank), one epoch; a sampler records the ranks'
summed RSS every 0.2 s and the machine's lowest MemAvailable. The run is held in a memory
cgroup a little under the machine's memory, so an over-size model is killed there, not the
machine's other processes.

2026-12-04 (../2026-12-04-vit-memory): the TensorFlow rows added, run as
`VIT_ROOT=/work/runs/vit VIT_LAUNCHER=hvdcls-horovodrun python vit_mem.py l16-z2c tf-l16-z0 tf-h14-z2c`.
2026-12-05 (../2026-12-05-vit-tf-h14): each sample also has the cgroup's rss, cache, dirty and
writeback bytes (memory.stat) and the run's phase (status.json)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from PIL import Image

ROOT = Path(os.environ.get("VIT_ROOT", "/work/runs28/vit"))
DATA = ROOT / "data"
CG = Path("/sys/fs/cgroup/memory/vitprobe")


def make_data(size):
    rng = np.random.default_rng(0)
    for split, n in (("train", 2), ("val", 1)):
        for cls in ("a", "b"):
            d = DATA / f"{size}" / split / cls
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return DATA / f"{size}"


def cgroup_stat():
    """The cgroup's (rss, cache, dirty, writeback) bytes: the page cache is charged to it too."""
    stat = dict(line.split() for line in (CG / "memory.stat").read_text().splitlines())
    return tuple(int(stat[k]) for k in ("total_rss", "total_cache", "total_dirty", "total_writeback"))


def phase(out):
    try:
        return json.loads((out / "status.json").read_text())["phase"]
    except (OSError, ValueError, KeyError):
        return None


def ranks():
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "hvdcls" in cmd and " train " in cmd and "horovodrun" not in cmd:
            out.append(p)
    return out


def run(name, model, size, patch, zero, ckpt, backend="torch"):
    data = make_data(size)
    out = ROOT / name
    limit = int(os.environ.get("VIT_LIMIT_BYTES") or psutil.virtual_memory().total - int(1.5 * 2**30))
    CG.mkdir(exist_ok=True)
    (CG / "memory.limit_in_bytes").write_text(str(limit))
    launcher = os.environ.get("VIT_LAUNCHER", "horovodrun")
    cmd = [launcher, "--gloo", "-np", "2", "-H", "localhost:2", "hvdcls", "train", "--backend", backend,
           "--data", str(data), "--model", model, "--epochs", "1", "-b", "2", "--lr", "0.001", "--quiet",
           "--output-dir", str(out), "optimizer.name=adamw", f"data.image_size={size}",
           f"model.patch_size={patch}", f"training.zero={zero}",
           f"training.activation_checkpointing={'true' if ckpt else 'false'}", "data.workers=0"]
    peak, low, samples = 0, psutil.virtual_memory().available, []
    started = time.time()
    log = open(ROOT / f"{name}.log", "w")  # noqa: SIM115 (the child writes it until it ends)
    proc = subprocess.Popen(["bash", "-c", f'echo $$ > {CG}/tasks; exec "$@"', "x", *cmd],
                            stdout=log, stderr=subprocess.STDOUT)
    while proc.poll() is None:
        rss = 0
        for p in ranks():
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        avail = psutil.virtual_memory().available
        peak, low = max(peak, rss), min(low, avail)
        samples.append((round(time.time() - started, 1), rss, *cgroup_stat(), phase(out)))
        time.sleep(0.2)
    summary = {}
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    row = {"name": name, "backend": backend, "model": model, "image_size": size, "patch": patch,
           "zero": zero, "activation_checkpointing": ckpt, "rc": proc.returncode,
           "seconds": round(time.time() - started, 1), "ranks_peak_rss_gb": round(peak / 2**30, 2),
           "machine_min_available_gb": round(low / 2**30, 2), "cgroup_limit_gb": round(limit / 2**30, 2),
           "cgroup_max_usage_gb": round(int((CG / "memory.max_usage_in_bytes").read_text()) / 2**30, 2),
           "memory": summary.get("memory"), "rank_memory": summary.get("rank_memory"),
           "parameters": (summary.get("model_info") or {}).get("parameters")}
    (CG / "memory.max_usage_in_bytes").write_text("0")
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # 7.5 GB a ViT-H/14 run: the disk filled
    (ROOT / f"{name}.json").write_text(json.dumps({**row, "samples": samples}))
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    ROOT.mkdir(parents=True, exist_ok=True)
    plan = {
        "l16-z0": ("vit_l_16", 224, 16, 0, False),
        "h14-z0": ("vit_h_14", 224, 14, 0, False),
        "h14-z2c": ("vit_h_14", 224, 14, 2, True),
        "l16-z2c": ("vit_l_16", 224, 16, 2, True),
        "tiny": ("vit_b_16", 32, 8, 2, True),
        "tf-l16-z0": ("vit_l_16", 224, 16, 0, False, "tensorflow"),  # 2026-12-04
        "tf-h14-z2c": ("vit_h_14", 224, 14, 2, True, "tensorflow"),
    }
    for name in sys.argv[1:]:
        run(name, *plan[name])
