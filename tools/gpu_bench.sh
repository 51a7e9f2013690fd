#!/usr/bin/env bash
# Single-GPU ResNet-50 training throughput on a bare NVIDIA host, in under 8 minutes.
#
#     OUT=/some/dir tools/gpu_bench.sh          # results: $OUT/gpu_bench.json (+ one JSON per run)
#
# What it measures, and what it does not:
# - the plain-torch loop of `hvdcls bench --device cuda` (benchmarks/ddp_torch.py under torchrun,
#   one process: DDP over NCCL with a world of one, float16 autocast + GradScaler, channels-last
#   batches), ResNet-50 at 224 px, on one batch held in GPU memory (synthetic images/s) and on
#   JPEGs read through torchvision's ImageFolder + DataLoader (the real input pipeline);
# - NOT hvdcls's own step (hvdcls.bench.worker): the torch backend imports horovod.torch, and
#   Horovod does not build in minutes on a bare host (`make setup GPU=1` does that, with NCCL).
#   Nor raw Horovod, for the same reason. Run `hvdcls bench --device cuda` where Horovod is built.
#
# It makes its own venv (torch, torchvision, numpy, pillow from the package index: the host must
# reach it, or PYTHON may name an interpreter that already has torch). Read-only on the repo.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/runs/gpu_bench}
VENV=${VENV:-/tmp/hvdcls-gpu-venv}
BATCH=${BATCH:-128}         # per GPU; ResNet-50 at 224 px with AMP fits many times over on 80+ GB
IMAGE_SIZE=${IMAGE_SIZE:-224}
WORKERS=${WORKERS:-8}       # DataLoader workers for the ImageFolder run
mkdir -p "$OUT"

fail() {  # one line on stderr and in the results, so a failed run still says why
    printf '{"error": "%s"}\n' "$1" > "$OUT/gpu_bench.json"
    echo "gpu_bench: $1" >&2
    exit 1
}

command -v nvidia-smi > /dev/null && nvidia-smi -L | grep -q '^GPU ' || fail "no NVIDIA GPU (nvidia-smi -L)"
nvidia-smi -L > "$OUT/gpus.txt"

if [[ -z "${PYTHON:-}" ]]; then
    python3 -m venv "$VENV" || fail "python3 -m venv failed"
    PYTHON=$VENV/bin/python
    timeout 300 "$PYTHON" -m pip install -q torch torchvision numpy pillow \
        || fail "pip install torch torchvision numpy pillow failed (no package index reachable?)"
fi
TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1)

# The JPEGs, written by the bench's own writer: 2048 images at twice the image size.
DATA=$(mktemp -d)
trap 'rm -rf "$DATA"' EXIT
PYTHONPATH=$REPO timeout 120 "$PYTHON" -c "
from pathlib import Path
from hvdcls.bench import data as bench_data
bench_data.write_dataset(Path('$DATA'), 2048, $IMAGE_SIZE, ['imagefolder'])
" || fail "writing the ImageFolder data set failed"

COMMON=(--model resnet50 --batch-size "$BATCH" --image-size "$IMAGE_SIZE" --device cuda
        --threads 4 --warmup 10 --steps 30 --reps 3)
cd "$REPO/benchmarks"
timeout 150 "${TORCHRUN[@]}" ddp_torch.py "${COMMON[@]}" --out "$OUT/torch-memory.json" \
    || fail "the synthetic (memory) run failed"
timeout 200 "${TORCHRUN[@]}" ddp_torch.py "${COMMON[@]}" --data imagefolder \
    --data-path "$DATA/data/imagefolder" --loader-workers "$WORKERS" --out "$OUT/torch-imagefolder.json" \
    || fail "the ImageFolder run failed"

"$PYTHON" - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
summary = {"gpus": (out / "gpus.txt").read_text().splitlines(), "model": "resnet50",
           "runner": "plain torch (benchmarks/ddp_torch.py, world of one), float16 AMP", "runs": {}}
for name in ("memory", "imagefolder"):
    run = json.loads((out / f"torch-{name}.json").read_text())
    summary["runs"][name] = {
        "images_per_sec_median": statistics.median(run["images_per_sec"]),
        "images_per_sec": run["images_per_sec"], "step_seconds": run["step_seconds"],
        "data_wait_seconds_per_step": run.get("data_wait_seconds"), "versions": run["versions"]}
tmp = out / "gpu_bench.json.tmp"
tmp.write_text(json.dumps(summary, indent=2) + "\n")
tmp.replace(out / "gpu_bench.json")
print(json.dumps({k: v["images_per_sec_median"] for k, v in summary["runs"].items()}))
EOF
