"""A long test run's figures kept as JSON (issue 51: a figure the docs show comes from a results
file): when HVDCLS_RESULTS_DIR names a directory, `keep` writes the test's raw numbers there;
unset, as in `make test`, it writes nothing."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESULTS_DIR = "HVDCLS_RESULTS_DIR"


def keep(name: str, figures: dict[str, Any]) -> None:
    """Write figures to $HVDCLS_RESULTS_DIR/name (sorted keys, so that a rerun diffs cleanly)."""
    where = os.environ.get(RESULTS_DIR)
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / name).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
