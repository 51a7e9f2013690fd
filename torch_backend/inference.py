"""A trained torch run for the inference commands (hvdcls/inference/contract.py): evaluate,
predict and export, in one process, without Horovod.

    load(run, device="auto") -> TorchInference      the checkpoint's weights (the EMA's when kept)
    export formats: state-dict (.safetensors, or torch.save's .pth with a .json card beside
                    it), torchscript (the card as the extra file model_card.json), onnx (the
                    card as metadata_props)

Every export takes NCHW float32 images normalised by the card's mean and std, and is loaded
back and run on a sample before it is accepted.

Mirror: tf_backend/inference.py.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch
from torch import nn

from hvdcls.backend import usable_cores
from hvdcls.data.batches import EpochBatches
from hvdcls.errors import UserError
from hvdcls.inference.contract import InferenceModel, check_export
from hvdcls.inference.run import RunModel
from hvdcls.modelcard import ModelCard
from hvdcls.models import COMPACT_CNN, normalise_name, vit_spec
from torch_backend import consolidate, data, models
from torch_backend.weights import load_run, run_state

EXPORT_FORMATS = ("state-dict", "torchscript", "onnx")
CONSOLIDATED_SUFFIX = ".safetensors"  # hvdcls checkpoint consolidate's file
LAYOUT = "NCHW"
CARD_KEY = "hvdcls_card"  # the card's key in a safetensors header and the .json beside a .pth
TORCHSCRIPT_CARD = "model_card.json"  # the extra file inside a TorchScript archive


def load(run: RunModel, device: str = "auto") -> "TorchInference":
    """The run's model in evaluation mode on `device` (auto: a GPU when torch sees one)."""
    card = run.card
    torch.set_num_threads(len(usable_cores()))
    model = models.build_model(card.model, card.num_classes, card.image_size, card.patch_size)
    load_run(model, run)  # a training.zero=3 run's a parameter at a time from its shard files
    return TorchInference(model.eval().to(pick_device(device)), card)


def sharded_run(run: RunModel) -> Optional[consolidate.ShardedModel]:
    """A training.zero=3 run's model, read from its shard files (`hvdcls checkpoint
    consolidate`: .write(FILE) writes it as one .safetensors file); None when not sharded."""
    path, state = run_state(run)
    return consolidate.sharded_model(run.checkpoint_dir, state, str(path))


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise UserError(f"device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device}: torch sees no CUDA device")
    return chosen


class TorchInference(InferenceModel):
    def __init__(self, model: nn.Module, card: ModelCard):
        self.model = model
        self.card = card
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def run(self, images: torch.Tensor) -> np.ndarray:
        """NCHW images (any device) -> logits as numpy float32."""
        return self.model(images.to(self.device)).float().cpu().numpy()

    def logits(self, images: np.ndarray) -> np.ndarray:
        return self.run(models.to_channels_first(torch.from_numpy(np.asarray(images, np.float32))))

    def batches(self, batches: EpochBatches, workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        loader = data.loader(batches, workers, pin_memory=self.device.type == "cuda")
        for images, labels in loader:
            yield self.run(images), labels.numpy()

    def export(self, fmt: str, path: Path, sample: np.ndarray) -> dict:
        if fmt not in EXPORTERS:
            raise UserError(f"export format {fmt!r}: the torch backend writes {', '.join(EXPORT_FORMATS)}")
        # Exports are made and checked on the host: what they are run with (ONNX Runtime's CPU
        # provider, a plain torch script) computes there, and a GPU's TF32 convolutions would
        # differ by more than the tolerance for reasons that are not the export's.
        model = self.model if self.device.type == "cpu" else copy.deepcopy(self.model).cpu()
        images = models.to_channels_first(torch.from_numpy(np.asarray(sample, np.float32)))
        with torch.inference_mode():
            expected = model(images).float().numpy()
        card = export_card(self.card)
        written = EXPORTERS[fmt](model, card, Path(path), images)
        return {"format": fmt, "layout": LAYOUT, "path": str(path),
                **check_export(fmt, expected, written.pop("outputs")), **written}


def builder(card: ModelCard) -> dict:
    """How to build the architecture again: torchvision's get_model or timm's create_model for
    their models (so a plain torchvision or timm script loads a state-dict export), else
    hvdcls's builder and its arguments."""
    name = normalise_name(card.model)
    if card.model.startswith(models.TIMM_PREFIX):
        return {"call": "timm.create_model", "args": [card.model[len(models.TIMM_PREFIX):]],
                "kwargs": {"num_classes": card.num_classes}}
    if name != normalise_name(COMPACT_CNN) and vit_spec(card.model) is None:
        tv_name = models.torchvision_names()[name]
        return {"call": "torchvision.models.get_model", "args": [tv_name],
                "kwargs": {"num_classes": card.num_classes}}
    return {"call": "torch_backend.models.build_model", "args": [card.model, card.num_classes],
            "kwargs": {"image_size": card.image_size, "patch_size": card.patch_size}}


def build_again(spec: dict) -> nn.Module:
    """The untrained model `builder` describes."""
    if spec["call"] == "torchvision.models.get_model":
        import torchvision

        return torchvision.models.get_model(*spec["args"], **spec["kwargs"])
    if spec["call"] == "timm.create_model":
        import timm

        return timm.create_model(*spec["args"], **spec["kwargs"])
    return models.build_model(*spec["args"], **spec["kwargs"])


def export_card(card: ModelCard) -> ModelCard:
    """The run's card with what an export adds: its layout and how to build the model."""
    return dataclasses.replace(card, extra={**card.extra, "layout": LAYOUT, "builder": builder(card)})


def card_json(card: ModelCard) -> str:
    return json.dumps(card.to_dict(), sort_keys=True)



def export_state_dict(model: nn.Module, card: ModelCard, path: Path, images: torch.Tensor) -> dict:
    """.safetensors: the card in the header's metadata; else torch.save's plain state dict with
    the card at PATH.json. Checked by building the model again and loading what was written."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    builder_spec = card.extra["builder"]
    sidecar = None
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path), metadata={CARD_KEY: card_json(card), "builder": json.dumps(builder_spec)})
    else:
        torch.save(state, path)
        sidecar = Path(f"{path}.json")
        sidecar.write_text(json.dumps(card.to_dict(), indent=2, sort_keys=True) + "\n")
    rebuilt = build_again(builder_spec)
    rebuilt.load_state_dict(read_state_dict(path))
    with torch.inference_mode():
        outputs = rebuilt.eval()(images).float().numpy()
    return {"outputs": outputs, **({"card_file": str(sidecar)} if sidecar else {})}


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def export_torchscript(model: nn.Module, card: ModelCard, path: Path, images: torch.Tensor) -> dict:
    """A traced module with the card as its extra file; checked through torch.jit.load."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice, on every call
        traced = torch.jit.trace(model, images[:1])
        torch.jit.save(traced, str(path), _extra_files={TORCHSCRIPT_CARD: card_json(card)})
        extra = {TORCHSCRIPT_CARD: ""}
        loaded = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
        outputs = loaded(images).float().numpy()
    if json.loads(extra[TORCHSCRIPT_CARD]) != card.to_dict():
        raise UserError(f"the torchscript export {path} lost its {TORCHSCRIPT_CARD}")
    return {"outputs": outputs}


def export_onnx(model: nn.Module, card: ModelCard, path: Path, images: torch.Tensor) -> dict:
    """ONNX with a dynamic batch axis, input "input" and output "logits", the card as
    metadata_props; checked with ONNX Runtime's CPU provider."""
    import onnx
    import onnxruntime

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter's deprecation notice
        torch.onnx.export(model, (images[:1],), str(path), input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
    exported = onnx.load(str(path))
    for key, value in card.onnx_metadata(LAYOUT).items():
        exported.metadata_props.add(key=key, value=value)
    onnx.save(exported, str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return {"outputs": session.run(["logits"], {"input": images.numpy()})[0]}


EXPORTERS: dict[str, Callable[[nn.Module, ModelCard, Path, torch.Tensor], dict]] = {
    "state-dict": export_state_dict, "torchscript": export_torchscript, "onnx": export_onnx}
