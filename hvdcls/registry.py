"""The one registry of backends: `--backend` takes its choices from here.

Backends are imported lazily, by name, so that the core (and `hvdcls --help`) never pulls in
torch or tensorflow. A backend whose framework is missing fails with a one-line hint.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from hvdcls.errors import UserError


@dataclass(frozen=True)
class BackendSpec:
    name: str  # what users type: --backend NAME
    package: str  # our package implementing it (mirrors the other backends file for file)
    framework: str  # the framework's top-level module
    horovod_module: str  # the Horovod binding the backend uses
    extra: str  # pip extra that installs the framework

    def install_hint(self) -> str:
        return f"run `make setup` (or `pip install 'hvdcls[{self.extra}]'` plus a Horovod build)"


BACKENDS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec("torch", "torch_backend", "torch", "horovod.torch", "torch"),
        BackendSpec("tensorflow", "tf_backend", "tensorflow", "horovod.tensorflow", "tensorflow"),
    )
}


def names() -> list[str]:
    return list(BACKENDS)


def get(name: str) -> BackendSpec:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UserError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}") from None


def _require(module: str, spec: BackendSpec) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise UserError(f"backend {spec.name!r} needs {module}, which is not installed: "
                        f"{spec.install_hint()}")


def require(name: str) -> None:
    """A one-line UserError now, in this process, when backend `name` cannot be imported: so a
    launcher (the bench, say) says it before starting ranks that would each fail with a traceback."""
    spec = get(name)
    _require(spec.framework, spec)
    _require(spec.horovod_module, spec)


# Submodules that use the framework alone, never Horovod: evaluate, export and predict run on a
# machine with torch or TensorFlow and no Horovod build.
WITHOUT_HOROVOD = ("inference", "weights")


def load(name: str, submodule: str) -> ModuleType:
    """Import `<backend package>.<submodule>` (e.g. `torch_backend.smoke`) on first use."""
    spec = get(name)
    if submodule in WITHOUT_HOROVOD:
        _require(spec.framework, spec)
    else:
        require(name)
    return importlib.import_module(f"{spec.package}.{submodule}")


def create_backend(name: str):
    """A fresh `hvdcls.backend.Backend` for `name`: imports `<package>.backend` now."""
    return load(name, "backend").create()
