"""hvdcls.launching.horovod_env: config -> HOROVOD_* variables, applied to a plain dict, never os.environ."""
import os
from pathlib import Path

import pytest

from hvdcls.config import HorovodConfig
from hvdcls.launching import horovod_env

ALL = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_HIERARCHICAL_ALLREDUCE",
       "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_TIMELINE",
       "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_CACHE_CAPACITY")
CACHE = "HOROVOD_CACHE_CAPACITY"  # elastic runs turn it off
# The stall settings have defaults, so they are always set (Horovod's own never shuts down).
STALL = {"HOROVOD_STALL_CHECK_DISABLE": "0", "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}


def test_variable_names():
    assert tuple(horovod_env.VARIABLES.values()) == ALL


# Our defaults for fusion and cycle: 32 MB and 5 ms.
OURS = {"HOROVOD_FUSION_THRESHOLD": "33554432", "HOROVOD_CYCLE_TIME": "5"}


def test_defaults_set_the_stall_settings_and_our_fusion_and_cycle():
    assert horovod_env.variables(HorovodConfig()) == STALL  # what the config itself asks for
    environ = {"PATH": "/bin"}
    assert horovod_env.apply(HorovodConfig(), environ) == {
        **dict.fromkeys(ALL, "default"), **OURS, "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}
    assert environ == {"PATH": "/bin", **STALL, **OURS}
    assert horovod_env.DEFAULTS == {"fusion_threshold_mb": 32.0, "cycle_time_ms": 5.0}


def test_stall_settings():
    assert horovod_env.variables(HorovodConfig(stall_check_seconds=2, stall_shutdown_seconds=5)) == {
        "HOROVOD_STALL_CHECK_DISABLE": "0", "HOROVOD_STALL_CHECK_TIME_SECONDS": "2",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5"}
    assert horovod_env.variables(HorovodConfig(stall_check_seconds=0, stall_shutdown_seconds=0)) == {
        "HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}


@pytest.mark.parametrize("mb, expected", [(64, "67108864"), (0.5, "524288"), (128.0, "134217728"),
                                          (1.25, "1310720")])
def test_fusion_threshold_in_bytes(mb, expected):
    assert horovod_env.variables(HorovodConfig(fusion_threshold_mb=mb)) == {
        "HOROVOD_FUSION_THRESHOLD": expected, **STALL}


@pytest.mark.parametrize("ms, expected", [(5, "5"), (2.5, "2.5"), (3.0, "3"), (0.1, "0.1")])
def test_cycle_time(ms, expected):
    assert horovod_env.variables(HorovodConfig(cycle_time_ms=ms)) == {"HOROVOD_CYCLE_TIME": expected, **STALL}


def test_every_setting():
    config = HorovodConfig(fusion_threshold_mb=32, cycle_time_ms=1.5, hierarchical_allreduce=True,
                           autotune=True, autotune_log="/tmp/autotune.csv", timeline="/tmp/tl.json")
    assert horovod_env.variables(config) == {
        "HOROVOD_FUSION_THRESHOLD": "33554432", "HOROVOD_CYCLE_TIME": "1.5",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": "/tmp/autotune.csv", "HOROVOD_TIMELINE": "/tmp/tl.json", **STALL}


def test_autotune_log_needs_autotune():
    assert horovod_env.variables(HorovodConfig(autotune_log="/tmp/a.csv")) == STALL


def test_false_flags_set_nothing():
    config = HorovodConfig(hierarchical_allreduce=False, autotune=False, timeline=None)
    assert horovod_env.variables(config) == STALL


def test_apply_sets_and_reports():
    before = dict(os.environ)
    environ = {"HOROVOD_CYCLE_TIME": "10", "OTHER": "x"}  # inherited from the launcher
    in_force = horovod_env.apply(HorovodConfig(fusion_threshold_mb=16, autotune=True), environ)
    assert environ == {"HOROVOD_CYCLE_TIME": "10", "OTHER": "x",
                       "HOROVOD_FUSION_THRESHOLD": "16777216", "HOROVOD_AUTOTUNE": "1", **STALL}
    assert in_force == {"HOROVOD_FUSION_THRESHOLD": "16777216", "HOROVOD_CYCLE_TIME": "10",
                        "HOROVOD_HIERARCHICAL_ALLREDUCE": "default", "HOROVOD_AUTOTUNE": "1",
                        "HOROVOD_AUTOTUNE_LOG": "default", "HOROVOD_TIMELINE": "default",
                        "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
                        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600", CACHE: "default"}
    assert dict(os.environ) == before  # only the mapping passed in is touched


def test_config_beats_the_inherited_value():
    environ = {"HOROVOD_CYCLE_TIME": "10"}
    assert horovod_env.apply(HorovodConfig(cycle_time_ms=2), environ)["HOROVOD_CYCLE_TIME"] == "2"
    assert environ["HOROVOD_CYCLE_TIME"] == "2"


def test_in_force_ignores_other_variables():
    assert horovod_env.in_force({"HOROVOD_TIMELINE": "t.json", "HOROVOD_GPU_OPERATIONS": "NCCL"}) == {
        **dict.fromkeys(ALL, "default"), "HOROVOD_TIMELINE": "t.json"}


def test_variables_of_some_keys_only():
    config = HorovodConfig(fusion_threshold_mb=4, cycle_time_ms=2, autotune=True)
    assert horovod_env.variables(config, keys=("fusion_threshold_mb", "cycle_time_ms")) == {
        "HOROVOD_FUSION_THRESHOLD": "4194304", "HOROVOD_CYCLE_TIME": "2"}


def test_the_bench_sets_fusion_and_cycle_through_the_table():
    from hvdcls.bench import matrix

    env = matrix.environment(matrix.Cell("raw-horovod", "torch", 2, "none", 16, "m"),
                             matrix.BenchSpec(fusion_threshold_mb=0.0, cycle_time_ms=2.5))
    assert env["HOROVOD_FUSION_THRESHOLD"] == "0" and env["HOROVOD_CYCLE_TIME"] == "2.5"
    assert "HOROVOD_STALL_CHECK_DISABLE" not in env


# Precedence, weakest first: our default < the environment (horovodrun's flags) < the config.
@pytest.mark.parametrize("environ, fusion_mb, expected", [
    ({}, None, "33554432"),                                       # ours
    ({"HOROVOD_FUSION_THRESHOLD": "67108864"}, None, "67108864"),  # the environment's beats ours
    ({}, 16, "16777216"),                                          # the config's beats ours
    ({"HOROVOD_FUSION_THRESHOLD": "67108864"}, 16, "16777216"),    # ... and the environment's
    ({"HOROVOD_FUSION_THRESHOLD": "0"}, None, "0"),                # fusion off, from horovodrun
])
def test_fusion_threshold_precedence(environ, fusion_mb, expected):
    in_force = horovod_env.apply(HorovodConfig(fusion_threshold_mb=fusion_mb), environ)
    assert environ["HOROVOD_FUSION_THRESHOLD"] == in_force["HOROVOD_FUSION_THRESHOLD"] == expected


@pytest.mark.parametrize("environ, cycle_ms, expected", [
    ({}, None, "5"), ({"HOROVOD_CYCLE_TIME": "10"}, None, "10"), ({}, 2.5, "2.5"),
    ({"HOROVOD_CYCLE_TIME": "10"}, 2.5, "2.5")])
def test_cycle_time_precedence(environ, cycle_ms, expected):
    in_force = horovod_env.apply(HorovodConfig(cycle_time_ms=cycle_ms), environ)
    assert environ["HOROVOD_CYCLE_TIME"] == in_force["HOROVOD_CYCLE_TIME"] == expected


def test_each_default_stands_alone():
    environ = {"HOROVOD_CYCLE_TIME": "10"}
    assert horovod_env.to_set(HorovodConfig(), environ) == {
        "HOROVOD_FUSION_THRESHOLD": "33554432", **STALL}
    assert horovod_env.to_set(HorovodConfig(cycle_time_ms=1), {}) == {
        "HOROVOD_FUSION_THRESHOLD": "33554432", "HOROVOD_CYCLE_TIME": "1", **STALL}


@pytest.mark.parametrize("config, environ", [
    (HorovodConfig(autotune=True), {}), (HorovodConfig(), {"HOROVOD_AUTOTUNE": "1"})])
def test_no_default_under_autotune(config, environ):
    """Horovod tunes only what its environment leaves unset: ours would pin both."""
    assert horovod_env.defaults(config, environ) == {}
    in_force = horovod_env.apply(config, environ)
    assert in_force["HOROVOD_FUSION_THRESHOLD"] == in_force["HOROVOD_CYCLE_TIME"] == "default"


def test_no_default_in_elastic_mode():
    """Horovod 0.28.1 crashed re-initialising an elastic world with both set: keep its own."""
    assert horovod_env.defaults(HorovodConfig(), {}, elastic=True) == {}
    in_force = horovod_env.apply(HorovodConfig(cycle_time_ms=2), {}, elastic=True)
    assert in_force["HOROVOD_FUSION_THRESHOLD"] == "default" and in_force["HOROVOD_CYCLE_TIME"] == "2"
    assert horovod_env.defaults(HorovodConfig(), {}, elastic=False) == OURS


def test_elastic_mode_turns_the_response_cache_off_unless_told_otherwise():
    """Its per-cycle Gloo allreduce shares the gradients' slot: a survivor of a lost host took a
    failed allreduce's leftover send into it and aborted (the Slurm elastic test's CI failures)."""
    environ: dict[str, str] = {}
    assert horovod_env.apply(HorovodConfig(), environ, elastic=True)[CACHE] == "0" == environ[CACHE]
    environ = {}
    assert horovod_env.apply(HorovodConfig(), environ, elastic=False)[CACHE] == "default"
    assert CACHE not in environ
    environ = {CACHE: "512"}  # the launcher's, kept
    assert horovod_env.apply(HorovodConfig(), environ, elastic=True)[CACHE] == "512" == environ[CACHE]
    environ = {CACHE: "512"}  # the config's beats it, either way, elastic or not
    assert horovod_env.apply(HorovodConfig(response_cache=True), environ, elastic=True)[CACHE] == "1024"
    assert horovod_env.apply(HorovodConfig(response_cache=False), environ, elastic=False)[CACHE] == "0"


@pytest.mark.parametrize("config, environ, where", [
    (HorovodConfig(fusion_threshold_mb=64, cycle_time_ms=5), {}, "horovod.cycle_time_ms=5"),  # resnet50.yaml
    (HorovodConfig(fusion_threshold_mb=64), {"HOROVOD_CYCLE_TIME": "3"}, "HOROVOD_CYCLE_TIME=3"),
    (HorovodConfig(cycle_time_ms=2), {"HOROVOD_FUSION_THRESHOLD": "1048576"}, "horovod.cycle_time_ms=2"),
    (HorovodConfig(), {"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "3"},
     "HOROVOD_CYCLE_TIME=3"),  # horovodrun --fusion-threshold-mb 1 --cycle-time-ms 3
])
def test_elastic_mode_drops_the_cycle_time_beside_a_fusion_threshold(config, environ, where):
    """Both set crashed Horovod 0.28.1's rank 0 when a host joined: the cycle time goes, said once."""
    warning = horovod_env.dropped_cycle(config, environ, elastic=True)
    assert warning is not None and warning.startswith(f"{where} dropped in elastic mode")
    assert "\n" not in warning and "crashes" in warning
    environ = dict(environ)
    in_force = horovod_env.apply(config, environ, elastic=True)
    assert "HOROVOD_CYCLE_TIME" not in environ and in_force["HOROVOD_CYCLE_TIME"] == "default"
    assert in_force["HOROVOD_FUSION_THRESHOLD"] != "default"


def test_the_shipped_resnet50_config_runs_elastic_without_both():
    """docs/elastic-and-reliability.md's example: configs/resnet50.yaml under training.elastic=true."""
    from hvdcls import config

    repo = Path(__file__).resolve().parents[2]
    loaded = config.load(repo / "configs" / "resnet50.yaml", ["data.path=/data/imagenet", "training.elastic=true"])
    environ: dict[str, str] = {}
    assert horovod_env.dropped_cycle(loaded.horovod, environ, loaded.training.elastic)
    horovod_env.apply(loaded.horovod, environ, elastic=loaded.training.elastic)
    assert environ["HOROVOD_FUSION_THRESHOLD"] == str(64 * 1024 * 1024) and "HOROVOD_CYCLE_TIME" not in environ


def test_the_cycle_time_stays_when_not_elastic_or_alone():
    both = HorovodConfig(fusion_threshold_mb=64, cycle_time_ms=5)
    assert horovod_env.dropped_cycle(both, {}, elastic=False) is None
    assert horovod_env.apply(both, {}, elastic=False)["HOROVOD_CYCLE_TIME"] == "5"
    assert horovod_env.dropped_cycle(HorovodConfig(cycle_time_ms=2), {}, elastic=True) is None
    assert horovod_env.dropped_cycle(HorovodConfig(), {"HOROVOD_CYCLE_TIME": "3"}, elastic=True) is None


def test_autotune_off_in_the_environment_keeps_our_defaults():
    assert horovod_env.defaults(HorovodConfig(), {"HOROVOD_AUTOTUNE": "0"}) == OURS


def test_the_bench_runs_under_our_defaults():
    from hvdcls.bench import matrix

    spec = matrix.BenchSpec()
    assert (spec.fusion_threshold_mb, spec.cycle_time_ms) == (32.0, 5.0)
