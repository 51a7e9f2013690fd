#!/bin/sh
# Issue 47's loader targets again, on the idle VM: the training crop at ImageNet-like size and
# at 12 MP, hvdcls (both backends) beside torchvision's and tf.data's pipelines, three
# interleaved rounds, one loader worker each; the same code as 2026-12-06-loader-fast.
set -e
python benchmarks/loader_alone.py --output-dir benchmarks/results/2026-12-06-loader-fast-idle \
    --sizes imagenet 12mp --transforms train --rounds 3 --timed-images imagenet=496 12mp=80 \
    --batch-size 16 --loader-workers 1 --pipelines hvdcls-torch hvdcls-tf torchvision tf.data
