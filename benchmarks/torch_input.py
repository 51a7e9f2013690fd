"""What the torch baselines train on: one random batch reused (--data memory), or torchvision's
ImageFolder with the usual augmentation, a DistributedSampler and a DataLoader."""
import argparse
import itertools
from typing import Iterator

import torch
import torchvision
from common import IMAGENET_MEAN, IMAGENET_STD
from torch.utils.data import DataLoader, DistributedSampler
from torch_step import memory_format
from torchvision import transforms


def batches(args: argparse.Namespace, rank: int, world_size: int,
            device: torch.device) -> Iterator[tuple]:
    if args.data == "memory":
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
        labels = torch.randint(0, 10, (args.batch_size,))
        return itertools.repeat(on_device(images, labels, device))
    return imagefolder_batches(args, rank, world_size, device)


def on_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device) -> tuple:
    return (images.to(device, non_blocking=True, memory_format=memory_format(device)),
            labels.to(device, non_blocking=True))


def imagefolder_batches(args: argparse.Namespace, rank: int, world_size: int,
                        device: torch.device) -> Iterator[tuple]:
    """This rank's batches of --data-path/train, epoch after epoch (a new shuffle each)."""
    augment = transforms.Compose([
        transforms.RandomResizedCrop(args.image_size), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    dataset = torchvision.datasets.ImageFolder(str(args.data_path / "train"), augment)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.loader_workers, pin_memory=device.type == "cuda")
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        for images, labels in loader:
            yield on_device(images, labels, device)
