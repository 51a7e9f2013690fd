"""Issue 50's accuracy target across the compose workers: ViT-S/16 (6 heads) at 16 px in patches
of 4 on the digits, np=4 as 2 replicas x parallel.tensor=2 (ranks 0-1 on worker1, 2-3 on
worker2) against np=2 data-parallel (one rank a worker), the same global batch (2 x 32), the same
seed and recipe, both backends, under horovodrun over Gloo in the compose cluster of
docker/compose.yaml (README.md says why not mpirun, and what the tensor group's wait changed).

    python benchmarks/results/2026-12-07-tensor-compose/run.py [EPOCHS]   # from the repository root

Writes runs.json here: each run's validation accuracy, loss and seconds per epoch, its
seconds, its summary's world size and hosts; a run already in it is not run again (delete it to start over). The
images must be built (make image); the cluster is brought up and down.
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.docker.cluster import SSH_PORT, Cluster

HERE = Path(__file__).resolve().parent
EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
RECIPE = ["--config", "/opt/hvdcls/configs/digits.yaml", "--model", "vit_s_16", "data.image_size=16",
          "model.patch_size=4", "optimizer.name=adamw", "--lr", "0.002", "optimizer.weight_decay=0.05",
          "--epochs", str(EPOCHS), f"output.checkpoint_every={EPOCHS}", "--quiet"]
LAYOUTS = {"dp-np2": (["worker1:1", "worker2:1"], []),
           "tp2-np4": (["worker1:2", "worker2:2"], ["parallel.tensor=2"])}


def horovodrun(hosts: list[str]) -> list[str]:
    np = sum(int(h.split(":")[1]) for h in hosts)
    return ["horovodrun", "--gloo", "-np", str(np), "-H", ",".join(hosts), "-p", str(SSH_PORT)]


def main() -> None:
    cluster = Cluster("hvdcls-tp-compose")
    kept = HERE / "runs.json"
    runs = json.loads(kept.read_text()) if kept.exists() else {}
    try:
        cluster.up(services=("keygen", "worker1", "worker2", "launcher"))
        for backend in ("torch", "tensorflow"):
            for layout, (hosts, extra) in LAYOUTS.items():
                if f"{backend}-{layout}" in runs:
                    continue
                out = f"/shared/runs/{backend}-{layout}"
                began = time.monotonic()
                cluster.launcher(*horovodrun(hosts), "hvdcls", "train", "--backend", backend, *RECIPE, *extra,
                                 "--output-dir", out, timeout=3600)
                seconds = time.monotonic() - began
                summary = cluster.read_json(f"{out}/summary.json")
                metrics = [json.loads(line) for line in
                           cluster.launcher("cat", f"{out}/metrics.jsonl").stdout.splitlines()]
                runs[f"{backend}-{layout}"] = {
                    "seconds": round(seconds, 1), "world_size": summary["world_size"],
                    "rank_hosts": summary["rank_hosts"], "val_accuracy": summary["val_accuracy"],
                    "val_accuracy_by_epoch": [m["val_accuracy"] for m in metrics],
                    "train_loss_by_epoch": [m["train_loss"] for m in metrics],
                    "epoch_seconds": [m["epoch_seconds"] for m in metrics]}
                print(backend, layout, runs[f"{backend}-{layout}"], flush=True)
                kept.write_text(json.dumps(runs, indent=1) + "\n")
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
