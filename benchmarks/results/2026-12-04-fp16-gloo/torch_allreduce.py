"""torch.distributed (Gloo) in-place all-reduce of 23.5 M elements (ResNet-50's gradients),
float32 and float16, twice each; run under `torchrun --nproc-per-node 2`."""
import time

import torch
import torch.distributed as dist

ELEMENTS = 23_500_000
CALLS = 7

dist.init_process_group("gloo")
torch.set_num_threads(1)
for dtype in (torch.float32, torch.float16, torch.float32, torch.float16):
    x = torch.randn(ELEMENTS).to(dtype)
    dist.all_reduce(x)
    seconds = []
    for _ in range(CALLS):
        started = time.perf_counter()
        dist.all_reduce(x)
        seconds.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        print("torch.distributed in-place", dtype, sorted(round(s * 1000) for s in seconds), "ms")
