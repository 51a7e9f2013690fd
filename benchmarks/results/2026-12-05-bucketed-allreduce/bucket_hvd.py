"""Experiment: Horovod all-reduce of flat gradient buckets (DDP's way: gradients are views of
the bucket, each bucket all-reduced in place as soon as backward completes it) against
hvd.DistributedOptimizer's per-tensor submission.

    PYTHONPATH=benchmarks horovodrun -np 2 -H localhost:2 --gloo \
        python benchmarks/results/2026-12-05-bucketed-allreduce/bucket_hvd.py --variant bucket --out r.json
"""
import time

import horovod
import horovod.torch as hvd
import torch
import torchvision
from common import measure, parse, write
from torch_input import batches
from torch_step import pick_device, plain_step

BUCKET_BYTES = 25 << 20


class Bucketed:
    def __init__(self, optimizer, params, bucket_bytes, sleep=False):
        self.optimizer, self.params = optimizer, [p for p in params if p.requires_grad]
        self.sleep = sleep  # wait for the handles with hvd.poll and short sleeps, not a busy wait
        order = list(reversed(self.params))  # backward makes the last layers' first
        self.buckets, current, size = [], [], 0
        for p in order:
            if current and (size + p.numel()) * 4 > bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel()
        self.buckets.append(current)
        self.flat = []
        self.bucket_of = {}
        for b, ps in enumerate(self.buckets):
            flat = torch.zeros(sum(p.numel() for p in ps))
            offset = 0
            for p in ps:
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                self.bucket_of[p] = b
                p.register_post_accumulate_grad_hook(self._ready)
            self.flat.append(flat)
        self.waiting = [len(ps) for ps in self.buckets]
        self.next, self.handles = 0, []
        self.param_groups = optimizer.param_groups

    def _ready(self, p):
        self.waiting[self.bucket_of[p]] -= 1
        while self.next < len(self.buckets) and self.waiting[self.next] == 0:
            self.handles.append(hvd.allreduce_async_(self.flat[self.next], op=hvd.Average,
                                                     name=f"bucket.{self.next}"))
            self.next += 1

    def zero_grad(self):
        for flat in self.flat:
            flat.zero_()
        self.waiting = [len(ps) for ps in self.buckets]
        self.next, self.handles = 0, []

    def step(self):
        for handle in self.handles:
            if self.sleep:
                while not hvd.poll(handle):
                    time.sleep(0.0002)
            hvd.synchronize(handle)
        self.optimizer.step()


def main() -> None:
    args = parse(__doc__.splitlines()[0], lambda p: p.add_argument("--variant", default="bucket"))
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = pick_device(args, hvd.local_rank())
    model = torchvision.models.get_model(args.model, weights=None, num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if args.variant in ("bucket", "bsleep"):
        optimizer = Bucketed(optimizer, list(model.parameters()), BUCKET_BYTES, sleep=args.variant == "bsleep")
        step = plain_step(model, optimizer, device)
    elif args.variant == "nocomm":  # the same ranks, no gradient exchange at all
        step = plain_step(model, optimizer, device)
    else:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        step = plain_step(model, optimizer, device, horovod_optimizer=True)
    timings = measure(step, batches(args, hvd.rank(), hvd.size(), device), args)
    digest = hvd.allgather_object(float(sum(p.detach().double().sum() for p in model.parameters())))
    if hvd.rank() == 0:
        write(args, args.variant, "torch", hvd.size(), sum(p.numel() for p in model.parameters()), timings,
              {"torch": torch.__version__, "horovod": horovod.__version__}, {"digests": digest})


if __name__ == "__main__":
    main()
