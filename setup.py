"""hvdcls: Horovod-based image classification training for PyTorch and TensorFlow.

Install with `make setup`, which also builds the matching Horovod wheel; see README.md.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup


def version() -> str:
    """hvdcls.__version__, read from the file (importing the package here is not safe)."""
    text = Path(__file__).with_name("hvdcls").joinpath("__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE).group(1)


def requirements(name: str) -> list[str]:
    """Pinned requirements shared with `make setup` (requirements/*.txt)."""
    lines = Path(__file__).with_name("requirements").joinpath(f"{name}.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


setup(
    name="hvdcls",
    version=version(),
    description="Horovod-based, framework-agnostic image classification training",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["hvdcls", "hvdcls.*", "torch_backend", "torch_backend.*",
                                    "tf_backend", "tf_backend.*"]),
    # The web console's templates and static files (uPlot vendored, with its licence): no build step.
    package_data={"hvdcls.serve.console": ["templates/*.html", "static/*"]},
    install_requires=requirements("core"),
    extras_require={
        # Horovod itself is not listed: PyPI's 0.28.1 does not build against these frameworks
        # without our build step (tools/horovod_wheel.py, run by `make setup`).
        "torch": requirements("torch"),
        "tensorflow": requirements("tensorflow"),
        "tensorflow-gpu": requirements("tensorflow-gpu"),
        "mpi": ["mpi4py>=4"],
        "serve": requirements("serve"),  # hvdcls serve / submit / jobs / ... (docs/serve.md)
        "track": requirements("track"),  # hvdcls train --mlflow URI (docs/tracking.md)
        "models": requirements("models"),  # hvdcls export / predict with ONNX, safetensors (docs/models.md)
        "fast-jpeg": requirements("fast-jpeg"),  # simplejpeg: faster JPEG decoding (hvdcls/data/turbo_jpeg.py)
        # The sweep (docs/sweeps.md): Optuna, and the search space's parser, of which hydra-core
        # itself cannot be listed, as its metadata caps omegaconf below our pin; `make setup`
        # installs it --no-deps (requirements/sweep-space.txt), and its missing is one line naming that.
        "sweep": requirements("sweep") + [r for r in requirements("sweep-space") if not r.startswith("hydra-core")],
        "test": requirements("test"),
    },
    entry_points={"console_scripts": ["hvdcls = hvdcls.cli:main",
                                      "hvdcls-horovodrun = hvdcls.launching.horovodrun:main"]},
    classifiers=[
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
