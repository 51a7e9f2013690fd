"""torch_backend.weights: model.weights from torchvision's cache, files and hvdcls runs, fitted
to the model built (head replaced, a ViT's position embedding interpolated), and refused in one
line when they do not fit; then once through `hvdcls train` (the build hook and the banner).

No network: torchvision's weights are a random resnet18 at 1000 classes placed in a temporary
$TORCH_HOME's hub cache under the file name of torchvision's URL.
"""
from pathlib import Path

import pytest
import torch
import torchvision
from torchvision.models.vision_transformer import VisionTransformer

from hvdcls import config as cfg
from hvdcls import pretrained
from hvdcls.errors import UserError
from tests.run_files import read_json
from tests.torch_backend.run_layout import hvdcls_train, write_run
from torch_backend import models, weights

CLASSES = 3


@pytest.fixture(scope="module")
def imagenet_resnet18() -> dict:
    """A resnet18 state dict at 1000 classes: torchvision's layout, random values."""
    torch.manual_seed(1)
    return torchvision.models.get_model("resnet18", num_classes=1000).state_dict()


def load(model, text: str, name: str = "resnet18") -> dict:
    return weights.load_weights(model, pretrained.parse(text), name)


def assert_backbone_is(model, state: dict, head: str = "fc") -> None:
    """Every entry but the head's equals `state`'s; the head kept its CLASSES outputs."""
    for key, value in model.state_dict().items():
        if key.startswith(f"{head}."):
            assert value.shape[0] == CLASSES, key
        else:
            assert torch.equal(value, state[key]), key


def test_a_torchvision_name_reads_the_hub_cache_and_replaces_the_head(imagenet_resnet18, tmp_path, monkeypatch):
    enum = torchvision.models.get_model_weights("resnet18")
    cached = tmp_path / "hub" / "checkpoints" / Path(enum.DEFAULT.url).name
    cached.parent.mkdir(parents=True)
    torch.save(imagenet_resnet18, cached)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    model = models.build_model("resnet18", CLASSES, 32)
    head = model.fc.weight.detach().clone()
    report = load(model, "default")  # any case
    assert report == {"replaced": [f"fc: 1000 -> {CLASSES} classes"], "interpolated": []}
    assert_backbone_is(model, imagenet_resnet18)
    assert torch.equal(model.fc.weight, head)  # left as initialised


def test_a_name_the_model_has_no_weights_for_lists_those_it_has():
    with pytest.raises(UserError) as err:
        load(models.build_model("resnet18", CLASSES, 32), "IMAGENET1K_V9")
    assert str(err.value) == ("model.weights=IMAGENET1K_V9: torchvision has no such weights for "
                              "resnet18; it has IMAGENET1K_V1, DEFAULT")
    with pytest.raises(UserError, match="compact_cnn has no torchvision weights"):
        load(models.compact_cnn(CLASSES), "DEFAULT", "compact_cnn")


@pytest.mark.parametrize("layout", ["plain", "timm", "torchvision_reference", "ddp_prefixed"])
def test_pth_state_dicts_plain_or_nested_load(imagenet_resnet18, tmp_path, layout):
    state = {"plain": imagenet_resnet18,
             "timm": {"state_dict": imagenet_resnet18, "epoch": 3, "arch": "resnet18"},
             "torchvision_reference": {"model": imagenet_resnet18, "optimizer": {}, "epoch": 3},
             "ddp_prefixed": {"state_dict": {f"module.{k}": v for k, v in imagenet_resnet18.items()}}}[layout]
    path = tmp_path / "r18.pth"
    torch.save(state, path)
    model = models.build_model("resnet18", CLASSES, 32)
    assert load(model, str(path))["replaced"] == [f"fc: 1000 -> {CLASSES} classes"]
    assert_backbone_is(model, imagenet_resnet18)


def test_safetensors_load_and_the_same_class_count_replaces_nothing(tmp_path):
    from safetensors.torch import save_file

    source = models.compact_cnn(CLASSES)
    path = tmp_path / "cnn.safetensors"
    save_file(source.state_dict(), str(path))
    model = models.compact_cnn(CLASSES)
    assert load(model, str(path), "compact_cnn") == {"replaced": [], "interpolated": []}
    for key, value in model.state_dict().items():
        assert torch.equal(value, source.state_dict()[key]), key


def test_another_architecture_is_one_line_naming_the_first_tensor(imagenet_resnet18, tmp_path):
    path = tmp_path / "r18.pth"
    torch.save(models.compact_cnn(10).state_dict(), path)
    with pytest.raises(UserError) as err:
        load(models.build_model("resnet18", CLASSES, 32), str(path))
    assert str(err.value) == f"model.weights={path} does not fit resnet18: it has no conv1.weight (64, 3, 7, 7)"
    narrower = {**imagenet_resnet18, "layer1.0.conv1.weight": torch.zeros(32, 64, 3, 3)}
    torch.save(narrower, path)
    with pytest.raises(UserError) as err:
        load(models.build_model("resnet18", CLASSES, 32), str(path))
    assert str(err.value).endswith("layer1.0.conv1.weight is (32, 64, 3, 3) there, (64, 64, 3, 3) in the model")
    torch.save({**imagenet_resnet18, "extra.weight": torch.zeros(2)}, path)
    with pytest.raises(UserError, match=r"it has extra.weight \(2,\), which the model has not"):
        load(models.build_model("resnet18", CLASSES, 32), str(path))


def test_an_unreadable_file_is_one_line(tmp_path):
    for name in ("bad.pth", "bad.safetensors"):
        (tmp_path / name).write_bytes(b"not a checkpoint")
        with pytest.raises(UserError, match=f"model.weights={tmp_path / name}: unreadable"):
            load(models.compact_cnn(CLASSES), str(tmp_path / name), "compact_cnn")


def tiny_vit(image_size: int, num_classes: int = CLASSES) -> VisionTransformer:
    return VisionTransformer(image_size=image_size, patch_size=8, num_layers=1, num_heads=2,
                             hidden_dim=16, mlp_dim=32, num_classes=num_classes)


def test_a_vits_position_embedding_of_another_grid_is_interpolated(tmp_path):
    source = tiny_vit(32, num_classes=10)  # a 4x4 grid
    path = tmp_path / "vit.pth"
    torch.save(source.state_dict(), path)
    model = tiny_vit(16)  # 2x2
    report = load(model, str(path), "tiny_vit")
    assert report == {"replaced": [f"heads.head: 10 -> {CLASSES} classes"],
                      "interpolated": ["encoder.pos_embedding: 4x4 -> 2x2 patches"]}
    theirs, ours = source.encoder.pos_embedding, model.encoder.pos_embedding
    assert ours.shape == (1, 1 + 4, 16)
    assert torch.equal(ours[:, 0], theirs[:, 0])  # the class token's is kept
    assert torch.equal(model.conv_proj.weight, source.conv_proj.weight)


def test_interpolating_positions_keeps_a_constant_grid_and_the_same_grid():
    embedding = torch.randn(1, 1 + 14 * 14, 8)
    assert torch.allclose(weights.interpolate_positions(embedding, 14), embedding, atol=1e-5)
    constant = torch.cat([embedding[:, :1], torch.full((1, 14 * 14, 8), 0.25)], dim=1)
    smaller = weights.interpolate_positions(constant, 3)
    assert smaller.shape == (1, 10, 8) and torch.allclose(smaller[:, 1:], torch.full((1, 9, 8), 0.25))
    assert weights.grid_side((1, 10, 8), 8) == 3 and weights.grid_side((1, 11, 8), 8) == 0


def test_a_run_gives_its_model_or_its_ema(tmp_path):
    trained, averaged = models.compact_cnn(CLASSES).state_dict(), models.compact_cnn(CLASSES).state_dict()
    averaged = {k: v for k, v in averaged.items() if v.is_floating_point()}  # what the EMA keeps
    state = {"model": trained, "ema": averaged, "optimizer": {}}
    for ema, expected in ((False, trained), (True, {**trained, **averaged})):
        run = write_run(tmp_path / f"run-{ema}", "torch", state, ema=ema)
        model = models.compact_cnn(CLASSES)
        assert load(model, str(run), "compact_cnn") == {"replaced": [], "interpolated": []}
        for key, value in model.state_dict().items():
            assert torch.equal(value, expected[key]), key
    # a checkpoint directory names the run too
    load(models.compact_cnn(CLASSES), str(tmp_path / "run-False" / "checkpoints" / "epoch-0002"), "compact_cnn")


def test_another_backends_run_is_one_line(tmp_path):
    run = write_run(tmp_path / "tf-run", "tensorflow", {})
    with pytest.raises(UserError) as err:
        load(models.compact_cnn(CLASSES), str(run), "compact_cnn")
    assert str(err.value).startswith(f"{run} was trained by the tensorflow backend; ")
    assert "\n" not in str(err.value)


def test_rank_0s_error_is_raised_on_every_rank_and_its_report_shared(tmp_path):
    """load_initial_weights with the backend's broadcast standing in: rank 1 reads nothing."""
    bad = tmp_path / "bad.pth"
    torch.save({"x": torch.zeros(1)}, bad)
    config = cfg.load(overrides=["model.name=compact_cnn", f"model.weights={bad}"])
    sent = []

    def share(outcome, name):
        sent.append(outcome)
        return outcome

    with pytest.raises(UserError, match="does not fit compact_cnn"):
        weights.load_initial_weights(models.compact_cnn(CLASSES), config, 0, share)
    assert sent[0][0] == "error"
    with pytest.raises(UserError, match="does not fit compact_cnn"):  # rank 1 gets rank 0's outcome
        weights.load_initial_weights(models.compact_cnn(CLASSES), config, 1, lambda _, name: sent[0])
    fine = {"source": "the file x", "replaced": [], "interpolated": []}
    assert weights.load_initial_weights(models.compact_cnn(CLASSES), config, 1, lambda _, n: ("ok", fine)) == fine


def test_hvdcls_train_starts_from_a_file_and_says_so(tmp_path):
    """The build hook end to end: a compact_cnn file at 10 classes into a 3-class run."""
    torch.manual_seed(2)
    source = models.compact_cnn(10)
    path = tmp_path / "cnn.pth"
    torch.save(source.state_dict(), path)
    result = hvdcls_train(tmp_path, "--output-dir", str(tmp_path / "run"), "model.name=compact_cnn",
                          f"model.weights={path}", f"data.synthetic.num_classes={CLASSES}", "optimizer.lr=0")
    head = len(source) - 1  # compact_cnn's head: the Sequential's last module
    assert f"weights: the file {path} (head replaced: {head}: 10 -> {CLASSES} classes)" in result.stdout
    info = read_json(tmp_path / "run" / "summary.json")["model_info"]["weights"]
    assert info == {"source": f"the file {path}", "replaced": [f"{head}: 10 -> {CLASSES} classes"],
                    "interpolated": []}
    trained = torch.load(tmp_path / "run" / "checkpoints" / "epoch-0001" / weights.CHECKPOINT_FILE)["model"]
    assert torch.equal(trained["0.weight"], source.state_dict()["0.weight"])  # lr 0: as loaded


def test_a_timm_model_takes_a_timm_checkpoint_with_its_head_replaced(tmp_path):
    timm = pytest.importorskip("timm")
    model = models.build_model("timm/resnet18", CLASSES)
    assert type(model).__module__.startswith("timm.") and model.fc.out_features == CLASSES
    source = timm.create_model("resnet18", pretrained=False, num_classes=1000).state_dict()
    path = tmp_path / "timm.pth"
    torch.save({"state_dict": source, "epoch": 9}, path)
    assert load(model, str(path), "timm/resnet18")["replaced"] == [f"fc: 1000 -> {CLASSES} classes"]
    assert_backbone_is(model, source)
    with pytest.raises(UserError, match="unknown timm model 'no_such_net'"):
        models.build_model("timm/no_such_net", CLASSES)
