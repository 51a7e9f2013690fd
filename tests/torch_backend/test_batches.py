"""The torch loader and loss on augmented, mixed batches: the cases of tests/cases/batches.py."""
import pytest
import torch

from tests.cases.batches import *  # noqa: F401,F403 (the shared cases, collected here)
from torch_backend import data
from torch_backend.backend import TorchBackend, dominant


class TorchFramework:
    name, cpu = "torch", torch.device("cpu")
    worker_named = r"loader worker 1, pid \d+"  # round robin: batch 1 is worker 1's; its process
    raw_loader = staticmethod(data.loader)

    @staticmethod
    def loader_worker(loader, batches):
        return object.__new__(TorchBackend).loader_worker(loader, batches)

    @staticmethod
    def batch(images, labels):
        return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)

    @staticmethod
    def ema_names(backend):
        return list(backend.ema_sources())

    @staticmethod
    def loader(batches, workers):
        for images, labels in data.loader(batches, workers):
            yield images.permute(0, 2, 3, 1).numpy(), labels.numpy()

    @staticmethod
    def backend_loader(batches, workers):
        backend = object.__new__(TorchBackend)
        backend.device, backend.memory_format = torch.device("cpu"), torch.contiguous_format
        for images, _ in backend.loader(batches, workers):
            handed_over = str(images.dtype).replace("torch.", "")
            yield backend.to_device(images).permute(0, 2, 3, 1).numpy(), handed_over

    @staticmethod
    def loss_and_correct(targets, logits, smoothing):
        """As TorchBackend.train_step computes them (its criterion, its dominant label)."""
        logits, targets = torch.from_numpy(logits), torch.from_numpy(targets)
        loss = torch.nn.CrossEntropyLoss(label_smoothing=smoothing)(logits, targets)
        return float(loss), int((logits.argmax(1) == dominant(targets)).sum())


@pytest.fixture(scope="module")
def framework():
    return TorchFramework()
