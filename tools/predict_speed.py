"""`hvdcls predict` against a plain torchvision inference loop (issue 46's target: at least 0.9x
its images per second), on ImageNet-like JPEGs made from photographs (hvdcls.bench.photos).

Both classify the same files with a ResNet-50 at 224 px, resize 256 and centre crop 224, the
same batch size and loader workers, and write the top class of each image to a CSV; each runs
as a process of its own and is timed whole (start-up, the model's load, the images, the CSV),
as a user would time the command. The rounds alternate which goes first.

    python tools/predict_speed.py --output-dir DIR [--images 1000] [--rounds 3] [-b 32] [-j 1]

DIR gets results.json (every round's seconds, the medians and the ratio) and the run that
`hvdcls predict` reads (a ResNet-50 trained one epoch on 16 of the photos: its weights do not
matter to the speed). The peer builds torchvision's resnet50 with the run's class count and
loads nothing: what it reads from disk is not what is measured.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvdcls.bench import photos  # noqa: E402
from hvdcls.launching import launch  # noqa: E402

PEER = '''import csv
import sys
from pathlib import Path

import torch
import torchvision
from PIL import Image
from torchvision import transforms as T

root, out = Path(sys.argv[1]), sys.argv[5]
classes, batch, workers = (int(value) for value in sys.argv[2:5])
files = sorted(root.rglob("*.jpg"))
prepare = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(),
                     T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

class Files(torch.utils.data.Dataset):
    def __len__(self):
        return len(files)
    def __getitem__(self, i):
        return prepare(Image.open(files[i]).convert("RGB"))

model = torchvision.models.resnet50(num_classes=classes).eval()
loader = torch.utils.data.DataLoader(Files(), batch_size=batch, num_workers=workers)
rows, seen = [], 0
with torch.inference_mode():
    for images in loader:
        probabilities = model(images).softmax(1)
        top = probabilities.max(1)
        for k in range(len(images)):
            rows.append((str(files[seen + k]), int(top.indices[k]), float(top.values[k])))
        seen += len(images)
with open(out, "w", newline="") as f:
    csv.writer(f).writerows(rows)
'''


def photo_folder(images: int) -> Path:
    """ImageNet-like JPEGs (500x375, a quarter portrait) under build/, made once."""
    return photos.write_photo_set(REPO / "build" / "loader_photos", photos.SIZES["imagenet"], images,
                                  photos.sample_photos()) / "train"


def trained_run(out: Path, folder: Path) -> Path:
    """A ResNet-50 run for `hvdcls predict`: one epoch on 8 photos of each of 2 classes."""
    run = out / "resnet50-run"
    if (run / "summary.json").is_file():
        return run
    tiny = out / "tiny"
    shutil.rmtree(tiny, ignore_errors=True)
    for name in sorted(p.name for p in folder.iterdir())[:2]:
        (tiny / "train" / name).mkdir(parents=True)
        for image in sorted((folder / name).glob("*.jpg"))[:8]:
            shutil.copy(image, tiny / "train" / name / image.name)
    command = launch.hvdcls_command("train", "--backend", "torch", "--data", str(tiny), "--epochs", "1",
                                    "--output-dir", str(run), "model.name=resnet50", "data.image_size=224",
                                    "training.batch_size=8", "optimizer.lr=0.1", "output.report=false",
                                    "output.tensorboard=false", "data.val_fraction=0.25")
    subprocess.run(command, check=True, env=launch.single_host_env())
    return run


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, env=launch.single_host_env(), stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("-j", "--workers", type=int, default=1)
    args = parser.parse_args()
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    folder = photo_folder(args.images)
    count = len(list(folder.rglob("*.jpg")))
    run = trained_run(out, folder)
    classes = json.loads((run / "summary.json").read_text())["num_classes"]
    peer = out / "torchvision_loop.py"
    peer.write_text(PEER)
    commands = {
        "hvdcls": launch.hvdcls_command("predict", str(run), str(folder), "-o", str(out / "hvdcls.csv"),
                                        "-b", str(args.batch_size), "-j", str(args.workers)),
        "torchvision": [sys.executable, str(peer), str(folder), str(classes), str(args.batch_size),
                        str(args.workers), str(out / "torchvision.csv")],
    }
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(args.rounds):
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        for name in order:
            seconds[name].append(timed(commands[name]))
            print(json.dumps({"round": round_, "runner": name, "seconds": round(seconds[name][-1], 2)}), flush=True)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    result = {"images": count, "batch_size": args.batch_size, "workers": args.workers, "rounds": args.rounds,
              "seconds": seconds, "median_seconds": median,
              "images_per_second": {name: count / value for name, value in median.items()},
              "hvdcls_over_torchvision": median["torchvision"] / median["hvdcls"]}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("images_per_second", "hvdcls_over_torchvision")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
