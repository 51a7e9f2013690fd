"""The memory allocator of a training process: tcmalloc where it is installed.

Why: on CPU, a step makes and frees tensors of many megabytes (activations, gradients, the
buffers Horovod's all-gather returns). glibc's malloc hands every block above its mmap
threshold (32 MiB at most) straight back to the kernel, so the next step's block of the same
size is fresh memory the kernel faults in page by page; tcmalloc keeps freed spans and reuses
them. Measured on a 2-core VM (docs/benchmarks.md, "tcmalloc"): ResNet-50 at np=2 1.03x
(zero=1: 1.15x), the digits recipe's epoch at np=2 1.12x, lower peak RSS.

A process gets another allocator only when it starts (LD_PRELOAD), so `hvdcls train` and the
bench's worker execute themselves again, once, with it preloaded, before anything heavy is
imported: the same process id, arguments and environment, under any launcher (horovodrun,
mpirun, srun, a container). HVDCLS_ALLOCATOR chooses: `tcmalloc` (the default; glibc's when
the library is not installed), `jemalloc`, or `system` (glibc's, no re-execution).

Framework-free, standard library only.
"""
from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional

from hvdcls.errors import UserError

ENV = "HVDCLS_ALLOCATOR"
DEFAULT = "tcmalloc"
# The libraries each choice may load, best first (names as ctypes.util.find_library takes them).
LIBRARIES: dict[str, tuple[str, ...]] = {
    "tcmalloc": ("tcmalloc_minimal", "tcmalloc"),  # Debian: libtcmalloc-minimal4
    "jemalloc": ("jemalloc",),                      # Debian: libjemalloc2
    "system": (),
}
# Set in the re-executed process (and so in its children): the library it preloaded, so that a
# library the loader could not preload does not make the process execute itself forever.
LOADED_ENV = "HVDCLS_ALLOCATOR_LOADED"


def loaded(maps: Path = Path("/proc/self/maps")) -> str:
    """Which allocator this process runs on, read from its mapped libraries (summary.json)."""
    try:
        text = maps.read_text()
    except OSError:
        return "unknown"
    for name in ("tcmalloc", "jemalloc"):
        if f"lib{name}" in text:
            return name
    return "system"


def preload_environment(environ: Mapping[str, str],
                        find: Callable[[str], Optional[str]] = ctypes.util.find_library,
                        running: Callable[[], str] = loaded) -> Optional[dict[str, str]]:
    """The environment to execute this process again with, or None to go on as it is:
    `system` chosen, already running on the choice (re-executed, or preloaded by the user), or
    the default's library not installed. A chosen allocator other than the default that is not
    installed is the user's error."""
    choice = environ.get(ENV, "") or DEFAULT
    if choice not in LIBRARIES:
        raise UserError(f"{ENV}={choice!r}: choose one of {', '.join(LIBRARIES)}")
    if choice == "system" or running() == choice:
        return None
    library = next((found for name in LIBRARIES[choice] if (found := find(name))), None)
    if library is None:
        if choice == DEFAULT:
            return None  # not installed: glibc's malloc, as without hvdcls
        raise UserError(f"{ENV}={choice}: lib{LIBRARIES[choice][0]} is not installed "
                        f"(apt-get install libjemalloc2), or choose tcmalloc or system")
    if environ.get(LOADED_ENV) == library:
        return None  # re-executed with it once and still not on it (a broken library): no loop
    env = dict(environ)
    env["LD_PRELOAD"] = ":".join(p for p in (library, environ.get("LD_PRELOAD", "")) if p)
    env[LOADED_ENV] = library
    return env


def reexec_with_allocator() -> None:
    """Execute this process again with the chosen allocator preloaded (see the module's
    docstring); returns only when there is nothing to do. Call it first thing in a
    command's entry point, never from code a test imports and calls in its own process."""
    env = preload_environment(os.environ)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # orig_argv: the interpreter's own flags and `-m module` or the script, as it was started.
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
