"""hvdcls/launching/allocator.py: which allocator a training process re-executes itself with."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hvdcls.errors import UserError
from hvdcls.launching import allocator

INSTALLED = {"tcmalloc_minimal": "libtcmalloc_minimal.so.4", "jemalloc": "libjemalloc.so.2"}


def installed(name: str) -> str | None:
    return INSTALLED.get(name)


def nothing(name: str) -> None:
    return None


def on_glibc() -> str:
    return "system"


def test_default_preloads_tcmalloc_before_what_was_preloaded():
    env = allocator.preload_environment({"PATH": "/bin", "LD_PRELOAD": "libmine.so"}, installed, on_glibc)
    assert env is not None
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4:libmine.so"
    assert env[allocator.LOADED_ENV] == "libtcmalloc_minimal.so.4" and env["PATH"] == "/bin"
    assert allocator.preload_environment({allocator.ENV: ""}, installed, on_glibc)["LD_PRELOAD"] == (
        "libtcmalloc_minimal.so.4")  # empty: the default


def test_jemalloc_when_chosen():
    env = allocator.preload_environment({allocator.ENV: "jemalloc"}, installed, on_glibc)
    assert env is not None and env["LD_PRELOAD"] == "libjemalloc.so.2"


@pytest.mark.parametrize("environ, find, running", [
    ({allocator.ENV: "system"}, installed, on_glibc),                          # chosen: glibc's
    ({}, installed, lambda: "tcmalloc"),                                       # on it already
    ({allocator.LOADED_ENV: "libtcmalloc_minimal.so.4"}, installed, on_glibc),  # tried once: no loop
    ({}, nothing, on_glibc),                                                   # default, not installed
], ids=["system", "already-on-it", "preload-failed", "tcmalloc-missing"])
def test_nothing_to_do(environ, find, running):
    assert allocator.preload_environment(environ, find, running) is None


@pytest.mark.parametrize("environ, message", [
    ({allocator.ENV: "mimalloc"}, "HVDCLS_ALLOCATOR='mimalloc': choose one of tcmalloc, jemalloc, system"),
    ({allocator.ENV: "jemalloc"}, "HVDCLS_ALLOCATOR=jemalloc: libjemalloc is not installed"),
], ids=["unknown", "chosen-missing"])
def test_bad_choice_is_the_users_error(environ, message):
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(")):
        allocator.preload_environment(environ, nothing, on_glibc)


def test_loaded_reads_the_mapped_libraries(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n")
    assert allocator.loaded(maps) == "tcmalloc"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert allocator.loaded(maps) == "system"
    assert allocator.loaded(tmp_path / "absent") == "unknown"


def test_bad_choice_exits_2_in_one_line_before_training(tmp_path):
    """A real `python -m hvdcls train`: the re-execution comes first, and its error is one line."""
    env = {"PATH": "/usr/bin:/bin", allocator.ENV: "mimalloc"}
    result = subprocess.run([sys.executable, "-m", "hvdcls", "train", "--output-dir", str(tmp_path / "o")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "hvdcls: error: HVDCLS_ALLOCATOR='mimalloc': choose one of tcmalloc, jemalloc, system"]
    assert not (tmp_path / "o").exists()
