"""Baseline: the same step under PyTorch DistributedDataParallel (gloo on CPU, nccl on GPU),
launched by torchrun, compressed by DDP's own communication hooks (fp16_compress_hook,
powerSGD_hook at --powersgd-rank).

    torchrun --nproc_per_node 2 benchmarks/ddp_torch.py --out d.json
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank R --master-addr HOST0 --master-port P \
        benchmarks/ddp_torch.py --compression powersgd --out d.json       # one node per host

PowerSGD runs in one bucket unless --bucket-cap-mb says otherwise (see ONE_BUCKET_MB).
--anatomy DIR (tools/step_anatomy.py) adds hvdcls's probe (hvdcls.bench.anatomy), which only
observes: each rank's thread counters over the timed steps and, with --anatomy-hooks, when each
gradient was ready and when each bucket's communication started and ended (a comm hook that
wraps DDP's own, so the plain all-reduce then runs through a Python hook). Without --anatomy no
hvdcls code is imported.
"""
import os
import time

import torch
import torch.distributed as dist
from common import measure, parse, write
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch_input import batches
from torch_step import local_rank, pick_device, plain_step, torchvision_model

HOOKS = {"none": None, "fp16": "fp16_compress_hook", "powersgd": "powerSGD_hook"}
DEFAULT_BUCKET_MB = 25  # DDP's own default
# PowerSGD's hook chains collectives from gloo's callback thread; with several buckets in
# flight their order differs between ranks (seen here: "Received data size doesn't match",
# hangs). One bucket keeps one chain per step.
ONE_BUCKET_MB = 4096


def more_flags(parser) -> None:
    parser.add_argument("--bucket-cap-mb", type=float,
                        help=f"DDP's bucket size (default {DEFAULT_BUCKET_MB}; powersgd: "
                        f"{ONE_BUCKET_MB}, one bucket)")
    parser.add_argument("--anatomy", help="DIR: the step anatomy probe's output (see above)")
    parser.add_argument("--anatomy-hooks", action="store_true")


def bucket_cap_mb(args) -> float:
    if args.bucket_cap_mb is not None:
        return args.bucket_cap_mb
    return ONE_BUCKET_MB if args.compression == "powersgd" else DEFAULT_BUCKET_MB


def buckets(ddp: torch.nn.parallel.DistributedDataParallel) -> int | None:
    """How many gradient buckets DDP made (its logging data's bucket sizes), if it says."""
    sizes = ddp._get_ddp_logging_data().get("bucket_sizes")  # private, but what DDP logs
    return len(str(sizes).split(",")) if sizes else None


def comm_hook(args):
    """(state, hook): DDP's own communication hook for --compression, or None (DDP's built-in
    all-reduce)."""
    if args.compression == "fp16":  # DDP's counterpart of Horovod's fp16 compression
        return dist.group.WORLD, default_hooks.fp16_compress_hook
    if args.compression == "powersgd":  # DDP's own PowerSGD, compressing every timed step
        return (powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=max(2, args.warmup)),
                powerSGD_hook.powerSGD_hook)
    return None


def reported(probe, state, hook):
    """`hook` (None: a plain all-reduce) with each bucket's communication reported to the
    anatomy probe: from the hook's call until its future completes."""
    inner = hook or default_hooks.allreduce_hook

    def timed_hook(hook_state, bucket):
        started = time.time_ns()

        def done(future):
            buffer = bucket.buffer()
            probe.reduced(f"bucket{bucket.index()}", started, time.time_ns(),
                          buffer.numel() * buffer.element_size())
            return future.value()

        return inner(hook_state, bucket).then(done)

    return state, timed_hook


def main() -> None:
    args = parse(__doc__.splitlines()[0], more_flags)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = pick_device(args, local_rank())
    model = torchvision_model(args.model, args.image_size)
    model = model.to(device)  # channels-last on the batches only, as hvdcls does (torch_input)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb(args))
    hook, probe = comm_hook(args), None
    if args.anatomy:
        from hvdcls.bench.anatomy import Probe  # observes only (see the docstring)

        probe = Probe(args.anatomy, dist.get_rank(), hooks=args.anatomy_hooks)
        probe.watch_gradients(model.named_parameters())
        if args.anatomy_hooks:
            hook = reported(probe, *(hook or (None, None)))
    if hook is not None:
        ddp.register_comm_hook(*hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    step = plain_step(ddp, optimizer, device)
    if probe is not None:
        step = probe.timed(step)
    timings = measure(step, batches(args, dist.get_rank(), dist.get_world_size(), device), args,
                      probe.window() if probe else None)
    if dist.get_rank() == 0:
        write(args, "ddp", "torch", dist.get_world_size(),
              sum(p.numel() for p in model.parameters()), timings,
              {"torch": torch.__version__, "torchrun_master_port": os.environ.get("MASTER_PORT", "")},
              {"ddp": {"bucket_cap_mb": bucket_cap_mb(args), "buckets": buckets(ddp),
                       "hook": HOOKS[args.compression], "backend": dist.get_backend(),
                       "anatomy_hooks": bool(args.anatomy and args.anatomy_hooks)}})
    # Both ranks done with every collective (the last step's hook included) before either tears
    # its connections down: a rank destroying its Gloo group while the other still used it
    # aborted that one ("terminate called without an active exception"), 3 of 8 cross-link runs.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
