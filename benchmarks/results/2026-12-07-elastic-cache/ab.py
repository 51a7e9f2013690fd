"""An elastic digits job at np 2 (localhost:2), Horovod's response cache on (1024) against off (0),
interleaved, ROUNDS pairs; summary.json's images/s and accuracy of each run into OUT.

    python ab.py ROUNDS EPOCHS OUT.json [OVERRIDE...]
    ab-digits-3-epochs.json: 4 3;  ab-digits.json: 6 10;  ab-resnet18.json: 5 2 model.name=resnet18
"""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from hvdcls.launching import launch
from tests.parallel.test_elastic import discovery
from tests.parallel.test_train import NO_PICTURES

DIGITS = str(Path(__file__).resolve().parents[3] / "configs" / "digits.yaml")


def run(capacity: str, epochs: str, overrides: list[str]) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"cache-{capacity}-", dir="/tmp"))
    hosts, script = discovery(tmp, "localhost:2\n")
    command = launch.hvdcls_command("train", "--backend", "torch", "--config", DIGITS, "--output-dir",
                                    str(tmp / "run"), "--epochs", epochs, "--quiet", *overrides,
                                    "training.elastic=true", "training.commit_every=10", *NO_PICTURES)
    started = time.time()
    done = subprocess.run(launch.horovodrun_elastic(2, 1, 2, str(script), command, network_interface="lo"),
                          env={**launch.single_host_env(), "HOROVOD_CACHE_CAPACITY": capacity}, cwd=tmp,
                          capture_output=True, text=True)
    summary = json.loads((tmp / "run" / "summary.json").read_text())
    return {"cap": capacity, "rc": done.returncode, "wall": round(time.time() - started, 1),
            "images_per_sec": round(summary["images_per_sec"], 1), "val_accuracy": summary["val_accuracy"],
            "env": summary["horovod"]["environment"].get("HOROVOD_CACHE_CAPACITY")}


def main() -> None:
    rounds, epochs, out_file, overrides = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    rows = []
    for _ in range(rounds):
        for capacity in ("1024", "0"):
            rows.append(run(capacity, epochs, overrides))
            print(rows[-1], flush=True)
    Path(out_file).write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
