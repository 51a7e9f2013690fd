"""Reading what `hvdcls train` wrote into a run directory, for the tests."""
import json
from pathlib import Path


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
