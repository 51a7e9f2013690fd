"""Horovod (Gloo) in-place all-reduce of 23.5 M elements (ResNet-50's gradients), float32 and
float16, twice each; run under `hvdcls-horovodrun -np 2 -H localhost:2 --gloo`."""
import time

import horovod.torch as hvd
import torch

ELEMENTS = 23_500_000
CALLS = 7

hvd.init()
torch.set_num_threads(1)
for dtype in (torch.float32, torch.float16, torch.float32, torch.float16):
    x = torch.randn(ELEMENTS).to(dtype)
    hvd.allreduce_(x, op=hvd.Sum, name=f"w{dtype}")
    seconds = []
    for call in range(CALLS):
        started = time.perf_counter()
        hvd.allreduce_(x, op=hvd.Sum, name=f"x{dtype}_{call}")
        seconds.append(time.perf_counter() - started)
    if hvd.rank() == 0:
        print("horovod in-place", dtype, sorted(round(s * 1000) for s in seconds), "ms")
