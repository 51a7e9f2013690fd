"""The plain torch training step both torch baselines time: one fixed batch, SGD, cross-entropy."""
import argparse
from typing import Callable

import torch


def plain_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
               args: argparse.Namespace) -> Callable[[], float]:
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 10, (args.batch_size,))
    module.train()

    def step() -> float:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(module(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step
