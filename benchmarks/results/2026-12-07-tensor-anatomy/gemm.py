"""The four matrix products of a ViT-L/16 block at 394 tokens (2 images at 224 px), at T=1's
shapes or T=2's (each rank's half), timed in one thread: python gemm.py T [REPS]."""
import sys
import time

import torch

torch.set_num_threads(1)
T = int(sys.argv[1])
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
M, D, H = 394, 1024, 4096
SHAPES = [(M, D, 3 * D // T), (M, D // T, D), (M, D, H // T), (M, H // T, D)]  # QKV, out, MLP in, MLP out
mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in SHAPES]
for a, b in mats:
    a @ b  # warm-up
started = time.perf_counter()
for _ in range(REPS):
    for a, b in mats:
        a @ b
seconds = (time.perf_counter() - started) / REPS
flops = sum(2 * m * k * n for m, k, n in SHAPES)
print(f"T={T} {seconds * 1e3:.2f} ms/iter {flops / seconds / 1e9:.1f} GFLOP/s")
