"""torch.distributed (Gloo) in-place all-reduce of 23.5 M elements (ResNet-50's gradients), float32 and float16, twice each."""
import time, torch, torch.distributed as dist
dist.init_process_group("gloo"); torch.set_num_threads(1)
n = 23_500_000
for dtype in (torch.float32, torch.float16, torch.float32, torch.float16):
    x = torch.randn(n).to(dtype); dist.all_reduce(x)
    out = []
    for i in range(7):
        s = time.perf_counter(); dist.all_reduce(x); out.append(time.perf_counter() - s)
    if dist.get_rank() == 0: print("torch.distributed in-place", dtype, sorted(round(t * 1000) for t in out), "ms")
