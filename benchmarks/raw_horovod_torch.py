"""Baseline: the plainest Horovod training loop for PyTorch (Horovod's own example's shape).

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/raw_horovod_torch.py --out r.json
"""
import horovod
import horovod.torch as hvd
import torch
from common import measure, parse, write
from torch_input import batches
from torch_step import pick_device, plain_step, torchvision_model


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = pick_device(args, hvd.local_rank())
    model = torchvision_model(args.model, args.image_size)
    model = model.to(device)  # channels-last on the batches only, as hvdcls does (torch_input)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    compression = hvd.Compression.fp16 if args.compression == "fp16" else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    step = plain_step(model, optimizer, device, horovod_optimizer=True)
    timings = measure(step, batches(args, hvd.rank(), hvd.size(), device), args)
    if hvd.rank() == 0:
        write(args, "raw-horovod", "torch", hvd.size(),
              sum(p.numel() for p in model.parameters()), timings,
              {"torch": torch.__version__, "horovod": horovod.__version__})


if __name__ == "__main__":
    main()
