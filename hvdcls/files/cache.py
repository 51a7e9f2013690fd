"""The user's cache directory for hvdcls: what is slow to work out and the same every time
(Horovod's build facts, the digits' pixels), kept between runs. Deleting it is always safe."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$HVDCLS_CACHE, else $XDG_CACHE_HOME/hvdcls, else ~/.cache/hvdcls (as tools/setup.sh's wheels)."""
    explicit = os.environ.get("HVDCLS_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdcls"
