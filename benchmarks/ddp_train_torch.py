"""Peer for `hvdcls bench --to-accuracy`: the plain PyTorch reference, torchrun + DDP (gloo on
CPU), training compact_cnn (or --model) on the .npz split or an ImageFolder until the validation
accuracy reaches --target.

    torchrun --standalone --nproc_per_node 2 benchmarks/ddp_train_torch.py --data d.npz \
        --out runs/ddp --target 0.9 --epochs 10 --batch-size 16 --lr 0.05 --image-size 16

What a torch user would write: torchvision transforms on PIL images (RandomResizedCrop at
--scale/--ratio, optional flip, Normalize), a DistributedSampler, DDP, SGD (L2 weight decay on
every parameter, as torch's SGD takes it) or AdamW, the rate set per step (accuracy_common.lr_at),
evaluation every epoch on each rank's share of the validation set, summed with all_reduce.
An ImageFolder is read by torchvision.datasets.ImageFolder and a DataLoader of --workers
processes. The model is compact_cnn as hvdcls describes it (hvdcls/models.py), written out here,
or torchvision.models.get_model(--model) untrained.
"""
import time

import numpy as np
import torch
import torch.distributed as dist
import torchvision
from accuracy_common import COMPACT_CNN, Records, is_folder, load, lr_at, parse, write_summary
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import datasets, transforms


def compact_cnn(num_classes: int) -> nn.Module:
    """(conv3x3-BN-ReLU) x2, max pool, x2 stages of 32 then 64 filters; global average pool;
    linear head. He-normal (fan_out) convs, Glorot head with zero bias."""
    layers, channels = [], 3
    for filters in (32, 32, "pool", 64, 64, "pool"):
        if filters == "pool":
            layers.append(nn.MaxPool2d(2))
            continue
        conv = nn.Conv2d(channels, filters, 3, padding=1, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        layers += [conv, nn.BatchNorm2d(filters, eps=1e-5, momentum=0.1), nn.ReLU(inplace=True)]
        channels = filters
    head = nn.Linear(channels, num_classes)
    nn.init.xavier_uniform_(head.weight)
    nn.init.zeros_(head.bias)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), head)


class Arrays(Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.transform(Image.fromarray(self.images[index]).convert("RGB")), int(self.labels[index])


def transforms_for(args):
    normalise = [transforms.ToTensor(), transforms.Normalize(args.mean, args.std)]
    train = transforms.Compose([transforms.RandomResizedCrop(args.image_size, tuple(args.scale),
                                                             tuple(args.ratio)),
                                transforms.RandomHorizontalFlip(args.hflip), *normalise])
    return train, transforms.Compose([transforms.Resize((args.image_size, args.image_size)), *normalise])


def splits(args):
    """(train, val, classes): the .npz split's arrays, or the ImageFolder's train/ and val/."""
    train_tf, eval_tf = transforms_for(args)
    if is_folder(args.data):
        train = datasets.ImageFolder(f"{args.data}/train", train_tf)
        return train, datasets.ImageFolder(f"{args.data}/val", eval_tf), len(train.classes)
    data = load(args.data)
    return (Arrays(data["train_images"], data["train_labels"], train_tf),
            Arrays(data["val_images"], data["val_labels"], eval_tf), int(data["train_labels"].max()) + 1)


def build_model(name: str, classes: int) -> nn.Module:
    if name == COMPACT_CNN:
        return compact_cnn(classes)
    return torchvision.models.get_model(name, weights=None, num_classes=classes)


def loader(dataset, workers: int, **kwargs) -> DataLoader:
    return DataLoader(dataset, num_workers=workers, persistent_workers=workers > 0, **kwargs)


def make_optimizer(args, params):
    if args.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                           weight_decay=args.weight_decay)


def evaluate(model, batches, rank: int, world: int) -> float:
    """Accuracy over the whole validation set: this rank's every world-th image, summed."""
    model.eval()
    correct = torch.zeros(2)
    with torch.no_grad():
        for x, y in batches:
            correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float32)
    dist.all_reduce(correct)
    model.train()
    return float(correct[0] / correct[1])


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    started = time.time()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's too)
    train, val, classes = splits(args)
    sampler = DistributedSampler(train, world, rank, shuffle=True, seed=args.seed, drop_last=True)
    batches = loader(train, args.workers, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    val_batches = loader(Subset(val, range(rank, len(val), world)), args.workers, batch_size=256)
    model = nn.parallel.DistributedDataParallel(build_model(args.model, classes))
    optimizer = make_optimizer(args, model.parameters())
    loss_fn = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    records, steps, reached = Records(args.out, rank == 0), len(batches), None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(batches):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(args, epoch * steps + i, steps)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()
        accuracy = evaluate(model, val_batches, rank, world)
        records.add(epoch + 1, accuracy, steps * args.batch_size * world)
        if accuracy >= args.target:  # the same all-reduced figure on every rank: all stop alike
            reached = epoch + 1
            break
    if rank == 0:
        write_summary(args.out, {"runner": "ddp", "world_size": world, "reached_target_epoch": reached,
                                 "wall_seconds": time.time() - started, "model": args.model,
                                 "dataset": "imagefolder" if is_folder(args.data) else "digits",
                                 "versions": {"torch": torch.__version__}})
    dist.barrier()  # no rank tears its Gloo group down while another still uses it (ddp_torch.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
