"""The plain torch training step both torch baselines time: SGD, cross-entropy, and on
--device cuda float16 autocast with a GradScaler and channels-last memory."""
import argparse
import os
from typing import Callable

import torch


def pick_device(args: argparse.Namespace, local_rank: int) -> torch.device:
    if args.device == "cpu":
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)  # one GPU per process, by local rank
    return torch.device("cuda", local_rank)


def torchvision_model(name: str, image_size: int) -> torch.nn.Module:
    """torchvision's model by name, untrained, 10 classes; a ViT built for `image_size` (its
    position embeddings are sized for it: at another size its forward refuses the batch)."""
    import torchvision

    sized = {"image_size": image_size} if name.startswith("vit_") else {}
    return torchvision.models.get_model(name, weights=None, num_classes=10, **sized)


def local_rank() -> int:
    """torchrun sets LOCAL_RANK; horovodrun sets HOROVOD_LOCAL_RANK (and hvd.local_rank())."""
    return int(os.environ.get("LOCAL_RANK", os.environ.get("HOROVOD_LOCAL_RANK", "0")))


def memory_format(device: torch.device) -> torch.memory_format:
    # NHWC batches let cuDNN use tensor cores without transposes; on CPU keep torch's default.
    # Only the batches: Horovod refuses non-contiguous (channels-last) weights and gradients,
    # and both loops keep the weights as hvdcls does, so they compare like with like.
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


def plain_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
               horovod_optimizer: bool = False) -> Callable[[tuple], float]:
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    module.train()

    def step(batch: tuple) -> float:
        images, labels = batch
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(module(images), labels)
        scaler.scale(loss).backward()
        if amp and horovod_optimizer:
            # Horovod's AMP recipe: all-reduce, unscale the reduced gradients, step without
            # reducing again (unscaling first would race the in-flight all-reduce).
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)  # a plain optimizer.step() when the scaler is disabled
        scaler.update()
        return loss.item()

    return step
