"""Is there an NVIDIA GPU here? Asked of the driver's tool, not of a framework: importing torch
or tensorflow to find out would cost seconds and tie the answer to how they were built."""
from __future__ import annotations

import shutil
import subprocess

from hvdcls.errors import UserError


def nvidia_gpus() -> list[str]:
    """`nvidia-smi -L` lines ("GPU 0: ..."); none without the tool or a working driver."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        listed = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listed.returncode != 0:
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.startswith("GPU ")]


def require_nvidia_gpu(what: str) -> list[str]:
    gpus = nvidia_gpus()
    if not gpus:
        raise UserError(f"{what} needs an NVIDIA GPU and this machine has none "
                        "(no nvidia-smi, or it lists no GPU)")
    return gpus
