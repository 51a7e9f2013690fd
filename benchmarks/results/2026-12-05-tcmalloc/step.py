"""One process, one thread: the median of 8 ResNet-50 steps (64 px, batch 16, SGD + momentum).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python step.py tcmalloc
"""
import sys
import time

import torch
import torchvision

torch.set_num_threads(1)
model = torchvision.models.resnet50(num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images, labels = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))


def step() -> None:
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()


for _ in range(3):
    step()
seconds = []
for _ in range(8):
    started = time.perf_counter()
    step()
    seconds.append(time.perf_counter() - started)
seconds.sort()
print(sys.argv[1], "median ms", round(1000 * seconds[4], 1))
