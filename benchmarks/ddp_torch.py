"""Baseline: the same step under PyTorch DistributedDataParallel (gloo on CPU, nccl on GPU),
launched by torchrun.

    torchrun --nproc_per_node 2 benchmarks/ddp_torch.py --out d.json
"""
import os

import torch
import torch.distributed as dist
import torchvision
from common import measure, parse, write
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch_input import batches
from torch_step import local_rank, pick_device, plain_step


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = pick_device(args, local_rank())
    model = torchvision.models.get_model(args.model, weights=None, num_classes=10)
    model = model.to(device)  # channels-last on the batches only, as hvdcls does (torch_input)
    # PowerSGD's hook chains collectives from gloo's callback thread; with several buckets in
    # flight their order differs between ranks (seen here: "Received data size doesn't match",
    # hangs). One bucket keeps one chain per step.
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=4096 if args.compression == "powersgd" else 25)
    if args.compression == "fp16":  # DDP's counterpart of Horovod's fp16 compression
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    elif args.compression == "powersgd":  # DDP's own PowerSGD, compressing every timed step
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=max(2, args.warmup))
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    step = plain_step(ddp, optimizer, device)
    timings = measure(step, batches(args, dist.get_rank(), dist.get_world_size(), device), args)
    if dist.get_rank() == 0:
        write(args, "ddp", "torch", dist.get_world_size(),
              sum(p.numel() for p in model.parameters()), timings,
              {"torch": torch.__version__, "torchrun_master_port": os.environ.get("MASTER_PORT", "")})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
