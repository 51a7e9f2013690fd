#!/bin/sh
# Issue 47's to-accuracy target: ResNet-18 on 32 px letters (an ImageFolder of 26 classes, the
# DejaVu fonts: 3744 training images of 12 fonts, 2808 validation images of 9 held-out fonts)
# to 0.9, np=2, hvdcls against torchrun + DDP, each with its own loader; 3 interleaved runs.
# From the repository root.
python -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; \
from image_tree import write_letters_imagefolder as w; w(Path('/tmp/letters32'), size=32, variants=12)"
hvdcls bench --to-accuracy 0.9 --backends torch --np 2 --batch-size 64 --lr 0.4 --runs 3 \
    --max-epochs 12 --runners hvdcls ddp --output-dir benchmarks/results/2026-12-06-letters-to-accuracy \
    model.name=resnet18 data.path=/tmp/letters32 data.image_size=32 data.augment.preset=imagenet \
    "data.augment.scale=[0.35,1.0]" data.augment.hflip=0 data.eval_crop=1.0
python benchmarks/results/2026-12-06-letters-to-accuracy/figures.py
