"""Horovod (Gloo) in-place all-reduce of 23.5 M elements (ResNet-50's gradients), float32 and float16, twice each."""
import time, torch, horovod.torch as hvd
hvd.init(); torch.set_num_threads(1)
n = 23_500_000
for dtype in (torch.float32, torch.float16, torch.float32, torch.float16):
    x = torch.randn(n).to(dtype)
    hvd.allreduce_(x, op=hvd.Sum, name=f"w{dtype}")
    out = []
    for i in range(7):
        s = time.perf_counter(); hvd.allreduce_(x, op=hvd.Sum, name=f"x{dtype}_{i}"); out.append(time.perf_counter() - s)
    if hvd.rank() == 0: print("horovod in-place", dtype, sorted(round(t * 1000) for t in out), "ms")
