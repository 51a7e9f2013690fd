"""hvdcls.config: defaults, YAML + overrides + flags precedence, one-line UserErrors."""
from pathlib import Path

import pytest
from omegaconf.errors import OmegaConfBaseException

from hvdcls import config
from hvdcls.errors import UserError

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILES = sorted(p for pattern in ("*.yaml", "*.yml") for p in (REPO / "configs").glob(pattern))


def user_error(**kwargs) -> str:
    """The message of the UserError that config.load(**kwargs) raises; it must be one line."""
    with pytest.raises(UserError) as info:
        config.load(**kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.strip() == message and message
    return message


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- defaults and precedence ------------------------------------------------------------------

def test_defaults_load():
    cfg = config.load(overrides=["data.name=synthetic"])  # photographs-style data: ImageNet defaults
    assert isinstance(cfg, config.Config)
    assert cfg.model.name == "compact_cnn" and cfg.model.num_classes is None
    assert cfg.data.name == "synthetic" and cfg.data.path is None
    assert cfg.data.image_size == 224
    assert cfg.data.mean == config.IMAGENET_MEAN and cfg.data.std == config.IMAGENET_STD
    assert cfg.optimizer.name == "sgd" and cfg.optimizer.lr == 0.1
    assert cfg.optimizer.scale_lr == "per256" and cfg.schedule.warmup_epochs is None
    assert cfg.data.augment.preset == "auto" and cfg.data.augment.hflip is None
    assert cfg.schedule.name == "cosine" and cfg.schedule.milestones == []
    assert cfg.training.epochs == 10 and cfg.training.batch_size == 32
    assert cfg.horovod.backward_passes_per_step == 1 and cfg.horovod.fusion_threshold_mb is None
    assert cfg.output.checkpoint_every == 1 and cfg.output.keep_checkpoints == 2
    cfg.data.name = "auto"
    assert cfg == config.Config()  # exactly the schema's defaults


def test_digits_bring_their_own_defaults_under_everything_else(tmp_path):
    bare = config.load()  # no data named: the embedded digits
    assert (bare.data.name, bare.data.path) == ("auto", None)
    assert (bare.data.image_size, bare.data.augment.hflip, bare.data.eval_crop) == (16, 0.0, 1.0)
    assert bare.training.epochs == 12 and bare.optimizer.lr == 0.4  # 0.05 per worker of 32
    assert bare.data.augment.preset == "imagenet" and bare.schedule.warmup_epochs == 1.0
    named = config.load(overrides=["data.name=digits"])
    named.data.name = "auto"
    assert named == bare
    # the file, overrides and flags still win over the digits defaults
    cfg = config.load(write(tmp_path, "data:\n  image_size: 24\n"), ["data.augment.hflip=0.5"],
                      {"training.epochs": 3})
    assert (cfg.data.image_size, cfg.data.augment.hflip, cfg.training.epochs) == (24, 0.5, 3)
    # a path is not digits: the ImageNet-style defaults stay
    assert config.load(overrides=["data.path=/data/x"]).data.image_size == 224


def test_defaults_are_not_shared_between_loads():
    first = config.load(overrides=["data.name=synthetic"])
    first.data.mean.append(9.0)
    assert config.load(overrides=["data.name=synthetic"]).data.mean == config.IMAGENET_MEAN
    assert config.IMAGENET_MEAN == [0.485, 0.456, 0.406]


def test_overrides_are_typed():
    cfg = config.load(overrides=["optimizer.lr=0.05", "training.epochs=3", "training.amp=true",
                                 "schedule.milestones=[2,5]", "data.path=/data/x"])
    assert cfg.optimizer.lr == 0.05 and isinstance(cfg.optimizer.lr, float)
    assert cfg.training.epochs == 3 and isinstance(cfg.training.epochs, int)
    assert cfg.training.amp is True
    assert cfg.schedule.milestones == [2, 5]
    assert cfg.data.path == "/data/x"


def test_override_value_may_contain_equals():
    assert config.load(overrides=["output.dir=a=b"]).output.dir == "a=b"


def test_file_then_overrides_then_flags(tmp_path):
    path = write(tmp_path, "training:\n  epochs: 7\n  batch_size: 16\n  seed: 3\n"
                           "optimizer:\n  lr: 0.2\n  name: adam\n")
    from_file = config.load(path)
    training = from_file.training
    assert (training.epochs, training.batch_size, training.seed) == (7, 16, 3)
    assert from_file.optimizer.lr == 0.2 and from_file.optimizer.name == "adam"
    assert from_file.optimizer.momentum == 0.9  # untouched keys keep their defaults

    layered = config.load(path, overrides=["training.epochs=5", "training.batch_size=8"],
                          flags={"training.epochs": 4, "optimizer.lr": 0.3})
    assert layered.training.epochs == 4  # flag beats override beats file
    assert layered.training.batch_size == 8  # override beats file
    assert layered.training.seed == 3  # file beats default
    assert layered.optimizer.lr == 0.3  # flag beats file
    assert layered.optimizer.name == "adam"


def test_none_flags_are_ignored():
    cfg = config.load(overrides=["training.epochs=5"],
                      flags={"training.epochs": None, "optimizer.lr": None})
    assert cfg.training.epochs == 5 and cfg.optimizer.lr == config.load().optimizer.lr


def test_empty_config_file_gives_defaults(tmp_path):
    assert config.load(write(tmp_path, "")) == config.load()


# --- errors: one line naming the key ----------------------------------------------------------

@pytest.mark.parametrize("override, key", [
    ("optimizer.lrr=1", "optimizer.lrr"),
    ("nosuch.key=1", "nosuch"),
    ("training.epochs=abc", "training.epochs"),
    ("training.epochs=2.5", "training.epochs"),
    ("training.amp=maybe", "training.amp"),
    ("training.compile=maybe", "training.compile"),
    ("training.epochs=null", "training.epochs"),
    ("optimizer.lr=[1]", "optimizer.lr"),
])
def test_bad_override_key_or_type(override, key):
    message = user_error(overrides=[override])
    assert message.startswith(f"config override: {key}: "), message


def test_unknown_key_names_the_suggestion():
    assert "Did you mean: 'lr'?" in user_error(overrides=["optimizer.lrr=1"])


def test_bad_flag_names_the_key():
    assert user_error(flags={"training.epochs": "abc"}).startswith("config flag: training.epochs: ")
    assert user_error(flags={"optimizer.lrr": 1}).startswith("config flag: optimizer.lrr: ")


def test_bad_key_in_file_names_the_file_and_key(tmp_path):
    path = write(tmp_path, "optimizer:\n  lrr: 1\n")
    assert user_error(config_file=path).startswith(f"config file {path}: optimizer.lrr: ")


@pytest.mark.parametrize("override, key", [
    ("optimizer.name=rmsprop", "optimizer.name"),
    ("optimizer.scale_lr=cube", "optimizer.scale_lr"),
    ("schedule.name=poly", "schedule.name"),
    ("data.name=cifar", "data.name"),
    ("training.device=tpu", "training.device"),
    ("horovod.compression=bf16", "horovod.compression"),
    ("horovod.op=sum", "horovod.op"),
    ("horovod.wait=yield", "horovod.wait"),
    ("output.progress=fancy", "output.progress"),
    ("data.bad_files=ignore", "data.bad_files"),
])
def test_out_of_choice_values(override, key):
    value = override.split("=", 1)[1]
    allowed = ", ".join(config.CHOICES[key])
    assert user_error(overrides=[override]) == f"config {key}={value!r}: choose one of {allowed}"


@pytest.mark.parametrize("override, expected", [
    ("training.epochs=0", "config training.epochs=0: must be > 0"),
    ("training.epochs=-1", "config training.epochs=-1: must be > 0"),
    ("training.batch_size=0", "config training.batch_size=0: must be > 0"),
    ("horovod.backward_passes_per_step=0", "config horovod.backward_passes_per_step=0: must be > 0"),
    ("output.keep_checkpoints=0", "config output.keep_checkpoints=0: must be > 0"),
    ("optimizer.lr=-0.1", "config optimizer.lr=-0.1: must be >= 0"),
    ("optimizer.lr=-1", "config optimizer.lr=-1.0: must be >= 0"),  # an int reads as the float it becomes
    ("training.seed=-1", "config training.seed=-1: must be >= 0"),
    ("data.workers=-2", "config data.workers=-2: a number of loader workers >= 0 (0 reads in the "
                        "training process) or auto (from measured times)"),
    ("model.num_classes=0", "config model.num_classes=0: must be > 0 (or null)"),
    ("horovod.fusion_threshold_mb=-1", "config horovod.fusion_threshold_mb=-1.0: must be > 0 (or null)"),
    ("optimizer.momentum=1", "config optimizer.momentum=1.0: must be in [0, 1)"),
    ("data.val_fraction=1", "config data.val_fraction=1.0: must be in (0, 1)"),
    ("data.mean=[1,2]", "config data.mean=[1.0, 2.0]: needs 3 values (R, G, B)"),
    ("schedule.milestones=[5,3]", "config schedule.milestones=[5, 3]: must be increasing epochs"),
    ("training.profile_steps=-1", "config training.profile_steps=-1: must be >= 0"),
    ("training.commit_every=0", "config training.commit_every=0: must be > 0"),
    ("output.metrics_port=-1", "config output.metrics_port=-1: a TCP port in [0, 65535] (0: any free port)"),
    ("output.metrics_port=65536", "config output.metrics_port=65536: a TCP port in [0, 65535] (0: any free port)"),
    ("output.metrics_linger_seconds=-1", "config output.metrics_linger_seconds=-1.0: must be >= 0"),
    ("horovod.stall_check_seconds=-1", "config horovod.stall_check_seconds=-1: must be >= 0"),
    ("horovod.stall_shutdown_seconds=30",
     "config horovod.stall_shutdown_seconds=30: must be >= horovod.stall_check_seconds=60 (or 0: never)"),
    ("horovod.stall_check_seconds=0",
     "config horovod.stall_shutdown_seconds=600 needs the stall check: horovod.stall_check_seconds > 0"),
    ("horovod.stall_check_seconds=1.5", None),
])
def test_out_of_range_values(override, expected):
    if expected is None:  # OmegaConf's own type error: the key is named, the wording is its own
        assert user_error(overrides=[override]).startswith(f"config override: {override.split('=')[0]}: ")
        return
    assert user_error(overrides=[override]) == expected


def test_stall_and_bad_file_defaults():
    cfg = config.load()
    assert cfg.data.bad_files == "fail"
    assert (cfg.horovod.stall_check_seconds, cfg.horovod.stall_shutdown_seconds) == (60, 600)
    off = config.load(overrides=["horovod.stall_check_seconds=0", "horovod.stall_shutdown_seconds=0"])
    assert off.horovod.stall_check_seconds == 0


def test_watching_defaults_and_port_0():
    cfg = config.load(overrides=["output.metrics_port=0"])
    assert cfg.output.metrics_port == 0 and cfg.output.progress == "auto"
    assert (cfg.output.tensorboard, cfg.output.report, cfg.training.profile_steps) == (True, True, 0)
    assert config.load().output.metrics_port is None  # no endpoint unless asked


def test_zero_is_allowed_where_non_negative():
    cfg = config.load(overrides=["optimizer.lr=0", "data.workers=0", "output.checkpoint_every=0",
                                 "optimizer.momentum=0", "optimizer.weight_decay=0"])
    assert (cfg.optimizer.lr, cfg.data.workers, cfg.output.checkpoint_every) == (0.0, 0, 0)


def test_elastic_is_off_by_default_and_refuses_eval_only():
    training = config.load().training
    assert (training.elastic, training.commit_every) == (False, 20)
    assert user_error(overrides=["training.elastic=true", "training.eval_only=true",
                                 "training.resume=x"]).startswith(
        "config training.elastic=true with training.eval_only=true")


@pytest.mark.parametrize("item", ["optimizer.lr", "=3", " =3", "epochs"])
def test_override_without_equals(item):
    assert user_error(overrides=[item]) == (
        f"override {item!r} is not key=value (e.g. optimizer.lr=0.05)")


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    assert user_error(config_file=missing) == f"config file {missing} does not exist"


@pytest.mark.parametrize("text", ["optimizer: {lr: [1\n", "optimizer:\n  lr: 0.5\n  lr: 0.6\n",
                                  "training:\n\tepochs: 3\n"])
def test_invalid_yaml(tmp_path, text):
    path = write(tmp_path, text)
    assert user_error(config_file=path).startswith(f"config file {path} is not valid YAML: ")


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = write(tmp_path, "- model\n- data\n")
    assert user_error(config_file=path) == (
        f"config file {path} must hold a mapping of sections (model:, data:, ...)")


@pytest.mark.parametrize("name", ["digits", "synthetic"])
def test_path_with_a_pathless_data_set(name):
    message = user_error(overrides=[f"data.name={name}", "data.path=/data/x"])
    assert message.startswith(f"config data.path='/data/x' is set but data.name='{name}' uses no path")


@pytest.mark.parametrize("name", ["imagefolder", "lmdb"])
def test_path_needed(name):
    assert user_error(overrides=[f"data.name={name}"]) == f"config data.name='{name}' needs data.path"


@pytest.mark.parametrize("warmup", ["10", "12.5"])
def test_warmup_not_shorter_than_training(warmup):
    message = user_error(overrides=["training.epochs=10", f"schedule.warmup_epochs={warmup}"])
    assert message == (f"config schedule.warmup_epochs={float(warmup)}: must be shorter than "
                       "training.epochs=10")


def test_warmup_just_shorter_is_fine():
    cfg = config.load(overrides=["training.epochs=10", "schedule.warmup_epochs=9.5"])
    assert cfg.schedule.warmup_epochs == 9.5


def test_section_replaced_by_scalar_is_a_user_error():
    assert user_error(overrides=["training=3"]).startswith("config override: ")


def test_section_replaced_by_scalar_names_the_section():
    assert user_error(overrides=["training=3"]).startswith("config override: training: ")


def test_unresolvable_interpolation_is_a_user_error(monkeypatch):
    monkeypatch.delenv("HVDCLS_NO_SUCH_VAR", raising=False)
    user_error(overrides=["data.path=${oc.env:HVDCLS_NO_SUCH_VAR}"])


# --- serialisation ----------------------------------------------------------------------------

def test_to_dict():
    cfg = config.load(overrides=["training.epochs=3", "horovod.fusion_threshold_mb=32", "data.name=synthetic"])
    as_dict = config.to_dict(cfg)
    assert set(as_dict) == {"model", "data", "optimizer", "schedule", "training", "horovod", "output", "parallel"}
    assert as_dict["training"]["epochs"] == 3
    assert as_dict["horovod"]["fusion_threshold_mb"] == 32.0
    assert as_dict["data"]["augment"]["scale"] == [0.08, 1.0]
    assert type(as_dict["data"]["mean"]) is list


@pytest.mark.parametrize("overrides", [
    [],
    ["data.path=/data/imagenet", "data.name=imagefolder", "optimizer.name=adamw", "optimizer.lr=0.003",
     "schedule.name=multistep", "schedule.milestones=[3,6]", "schedule.warmup_epochs=1.5",
     "training.grad_clip_norm=1.0", "training.threads=4", "horovod.fusion_threshold_mb=64",
     "horovod.timeline=/tmp/t.json", "output.dir=runs/x", "model.num_classes=1000",
     "data.augment.ratio=[0.5,2.0]", "data.mean=[0.5,0.5,0.5]", "training.amp=true"],
])
def test_to_yaml_round_trip(tmp_path, overrides):
    cfg = config.load(overrides=overrides)
    again = config.load(write(tmp_path, config.to_yaml(cfg)))
    assert again == cfg
    assert config.to_dict(again) == config.to_dict(cfg)


def test_to_yaml_round_trip_of_yaml_looking_strings(tmp_path):
    cfg = config.load()
    cfg.output.dir, cfg.model.name, cfg.training.resume = "null", "123", "true"
    again = config.load(write(tmp_path, config.to_yaml(cfg)))
    assert (again.output.dir, again.model.name, again.training.resume) == ("null", "123", "true")


# --- the shipped configs/ ---------------------------------------------------------------------

@pytest.mark.skipif(not CONFIG_FILES, reason="configs/ holds no YAML files yet")
@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_shipped_config_loads(path):
    assert isinstance(config.load(path), config.Config)


def test_an_override_yaml_cannot_parse_names_its_key():
    """Found by tests/unit/test_properties.py: yaml's ScannerError used to escape."""
    assert user_error(overrides=["data.bad_files='"]).startswith(
        "config override data.bad_files: value \"'\" is not valid YAML (")


def test_choices_come_from_the_field_types_and_stay_plain_strings():
    import typing

    assert config.CHOICES["horovod.compression"] == typing.get_args(config.Compression)
    assert typing.get_args(typing.get_type_hints(config.TrainingConfig)["device"]) == \
        config.CHOICES["training.device"]
    cfg = config.load(overrides=["horovod.compression=fp16", "training.device=cpu", "data.name=synthetic"])
    assert type(cfg.horovod.compression) is str and cfg.horovod.compression == "fp16"
    assert type(cfg.training.device) is str and type(config.Config().output.progress) is str
    assert "compression: fp16" in config.to_yaml(cfg)
    assert config.to_dict(cfg)["training"]["device"] == "cpu"


def test_null_for_a_choice_names_the_choices():
    assert user_error(overrides=["training.device=null"]) == \
        "config training.device=None: choose one of auto, cpu, cuda"


def test_a_config_made_in_code_is_checked_too():
    made = config.Config()
    made.horovod.op = "sum"
    with pytest.raises(UserError, match=r"^config horovod.op='sum': choose one of average, adasum$"):
        config.validate(made)


# --- vision transformers and activation checkpointing (issue 28) ---------------------------------

def test_vit_patch_size_defaults_to_the_architectures_and_checkpointing_is_off():
    cfg = config.load(overrides=["model.name=vit_h_14", "data.image_size=224"])
    assert cfg.model.patch_size is None and cfg.training.activation_checkpointing is False
    assert config.load(overrides=["model.name=ViT_B_16", "data.image_size=32", "model.patch_size=8"]).model.patch_size == 8


@pytest.mark.parametrize("overrides, expected", [
    (["model.patch_size=8"], "model.patch_size=8 is for the ViTs"),  # compact_cnn has no patches
    (["model.name=vit_b_16", "data.image_size=32", "model.patch_size=0"], "model.patch_size=0: must be > 0"),
    (["model.name=vit_b_16", "data.image_size=40"], "data.image_size=40 is not a multiple of the ViT's patch size 16"),
    (["model.name=vit_h_14", "data.image_size=32"], "patch size 14"),
    (["training.activation_checkpointing=true", "horovod.sync_bn=true"], "horovod.sync_bn=true"),
])
def test_vit_and_checkpointing_settings_it_cannot_serve(overrides, expected):
    assert expected in user_error(overrides=overrides)


# --- optimizer.lr=auto ------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/data/mine", "/data/mine.lmdb"])
def test_a_users_data_path_defaults_to_the_range_test(path):
    assert config.load(overrides=[f"data.path={path}"]).optimizer.lr == "auto"
    assert config.load(overrides=["data.name=synthetic"]).optimizer.lr == 0.1  # no path: the schema's
    assert config.load().optimizer.lr == 0.4  # the digits keep theirs


def test_a_number_anywhere_wins_over_auto(tmp_path):
    users = ["data.path=/data/mine"]
    assert config.load(overrides=[*users, "optimizer.lr=0.2"]).optimizer.lr == 0.2
    assert config.load(overrides=users, flags={"optimizer.lr": 0.3}).optimizer.lr == 0.3
    assert config.load(write(tmp_path, "optimizer:\n  lr: 0.5\n"), users).optimizer.lr == 0.5
    for name in ("resnet50.yaml", "recipe-torchvision-v2.yaml"):  # their explicit values
        assert isinstance(config.load(REPO / "configs" / name, users).optimizer.lr, float), name
    assert config.load(REPO / "configs" / "digits.yaml").optimizer.lr == 0.4


def test_auto_is_not_the_default_where_the_sweep_cannot_run():
    users = "data.path=/data/mine"
    assert config.load(overrides=[users, "training.elastic=true"]).optimizer.lr == 0.1
    resumed = config.load(overrides=[users, "training.eval_only=true", "training.resume=/runs/x"])
    assert resumed.optimizer.lr == 0.1


@pytest.mark.parametrize("value, expected", [("1", 1.0), ("'0.05'", 0.05), ("1e-3", 0.001), ("auto", "auto")])
def test_lr_numbers_in_any_form_become_floats(value, expected):
    lr = config.load(overrides=[f"optimizer.lr={value}"]).optimizer.lr
    assert lr == expected and type(lr) is type(expected)


@pytest.mark.parametrize("value", ["fast", "'nan'", "true"])
def test_a_non_number_other_than_auto_is_one_line(value):
    assert "optimizer.lr" in user_error(overrides=[f"optimizer.lr={value}"])


def test_auto_with_eval_only_or_elastic_is_one_line():
    message = user_error(overrides=["optimizer.lr=auto", "training.eval_only=true", "training.resume=/runs/x"])
    assert message.startswith("config optimizer.lr=auto with training.eval_only=true")
    message = user_error(overrides=["optimizer.lr=auto", "training.elastic=true"])
    assert message.startswith("config optimizer.lr=auto with training.elastic=true")


def test_the_sweeps_range_is_checked():
    assert "min_lr < max_lr" in user_error(overrides=["optimizer.lr_find.min_lr=1", "optimizer.lr_find.max_lr=0.1"])
    assert "optimizer.lr_find.steps" in user_error(overrides=["optimizer.lr_find.steps=0"])
