"""`hvdcls-horovodrun`: Horovod's `horovodrun`, without asking the build the same question each launch.

Before every launch, horovodrun asks whether Horovod was built with Gloo (and, without --gloo,
with MPI) by forking a process that imports `horovod.tensorflow`: TensorFlow and all, for an
answer that changes only when Horovod is reinstalled. On this 2-core machine that is most of a
launch: a no-op job (`-np 1 ... true`) took 3.4-3.7 s under horovodrun and 0.33 s here, and
every job hvdcls starts (the service's, the bench's, the demo's) pays it.

Here the answer is asked once per installed Horovod binary, through the lighter torch binding
where there is one (`hvd.gloo_built()`, `hvd.mpi_built()`: Horovod's public calls), kept in the
user's cache directory under a key made of the extension libraries' paths, sizes and
modification times (a rebuilt or reinstalled Horovod asks again), and handed to Horovod's own
launcher, which does everything else unchanged: the same arguments, Gloo, MPI, elastic mode.
Where no binding answers, Horovod's own probes run as they would under horovodrun.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from importlib import util
from pathlib import Path

from hvdcls.files import fileio
from hvdcls.files.cache import cache_dir

CONTROLLERS = ("gloo", "mpi")
# Cheapest import first: torch's binding loads in about 2 s here, TensorFlow's in 3.5.
BINDINGS = ("torch", "tensorflow")
PROBE = ("import horovod.{binding} as hvd, json; "
         "print(json.dumps({{'gloo': bool(hvd.gloo_built()), 'mpi': bool(hvd.mpi_built())}}))")


def horovod_dir() -> Path | None:
    spec = util.find_spec("horovod")
    return Path(spec.origin).parent if spec and spec.origin else None


def extension_libraries(package: Path) -> list[Path]:
    """The compiled bindings (horovod/torch/mpi_lib_v2*.so, horovod/tensorflow/mpi_lib*.so)."""
    return sorted(path for binding in BINDINGS for path in (package / binding).glob("mpi_lib*.so"))


def build_key(libraries: list[Path]) -> str:
    """Changes whenever a library is rebuilt or reinstalled (its size or mtime moves)."""
    digest = hashlib.sha256()
    for library in libraries:
        stat = library.stat()
        digest.update(f"{library}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def cache_file(key: str) -> Path:
    return cache_dir() / f"horovod-controllers-{key}.json"


def probe(libraries: list[Path]) -> dict[str, bool] | None:
    """What the first binding that imports says it was built with; None when none does."""
    built = {library.parent.name for library in libraries}
    for binding in (name for name in BINDINGS if name in built):
        result = subprocess.run([sys.executable, "-c", PROBE.format(binding=binding)],
                                capture_output=True, text=True, check=False)
        if result.returncode == 0:
            facts = json.loads(result.stdout.strip().splitlines()[-1])
            return {name: bool(facts[name]) for name in CONTROLLERS}
    return None


def read_cached(path: Path) -> dict[str, bool] | None:
    try:
        facts = json.loads(path.read_text())
        return {name: bool(facts[name]) for name in CONTROLLERS}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cached(path: Path, facts: dict[str, bool]) -> None:
    """Atomically (fileio's temporary name, renamed); a cache that cannot be written is no error."""
    try:
        fileio.write_json_atomic(path, facts)
    except OSError:
        pass


def controllers_built() -> dict[str, bool] | None:
    """{'gloo': ..., 'mpi': ...} for the installed Horovod, from the cache or asked once."""
    package = horovod_dir()
    libraries = extension_libraries(package) if package else []
    if package is None or not libraries:
        return None
    path = cache_file(build_key(libraries))
    facts = read_cached(path)
    if facts is None:
        facts = probe(libraries)
        if facts is not None:
            write_cached(path, facts)
    return facts


def failed_status(message: str) -> int:
    """The exit status a failed launch hands on: the first failed rank's (Gloo: "Exit code: N",
    mpirun: "exit code N"; killed by signal S: 128 + S, as a shell says), else 1."""
    found = re.search(r"exit code:? (-?\d+)", message, re.IGNORECASE)
    code = int(found.group(1)) if found else 1
    if code < 0:
        code = 128 - code
    return code if 0 < code < 256 else 1


def cause(status: int) -> str:
    """What a failed rank's status most often means, where the status alone says it: a rank
    SIGKILLed (137) with no one to blame is the kernel's, or a memory cgroup's (a container, a
    Slurm job), out-of-memory killer, as when a model outgrows the machine."""
    if status == 128 + 9:
        return (" (137: SIGKILL, most often the out-of-memory killer: dmesg, or the memory limit of the "
                "container or job; training.zero, training.activation_checkpointing and "
                "HVDCLS_ALLOCATOR=system lower a rank's memory, docs/training.md)")
    return ""


def main() -> None:
    from horovod.runner import launch as horovod_launch

    facts = controllers_built()
    if facts is not None:
        # launch.py imported these two names from horovod.common.util; its run_controller and
        # its elastic path look them up there at call time.
        horovod_launch.gloo_built = lambda verbose=False: facts["gloo"]
        horovod_launch.mpi_built = lambda verbose=False: facts["mpi"]
    sys.argv[0] = "horovodrun"  # Horovod's usage and error lines name the command users know
    try:
        horovod_launch.run_commandline()
    except RuntimeError as err:
        # Horovod's launcher raises when a rank (or mpirun) failed, after the ranks said why on
        # their own output: a traceback of the launcher says nothing more. One line, and the
        # failed rank's status as ours (2: the rank's one-line user error; 75: its watchdog).
        message = " ".join(str(err).split())
        status = failed_status(message)
        print(f"hvdcls-horovodrun: {message}{cause(status)}", file=sys.stderr, flush=True)
        sys.exit(status)


if __name__ == "__main__":
    main()
