"""Reading what `hvdcls train` wrote into a run directory, for the tests."""
import json
from pathlib import Path


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def val_epoch(run):
    """A run's validation split as its training read it (one rank, the run's batch size), for
    a RunModel (hvdcls.inference.run.open_run)."""
    from hvdcls.data import datasets
    from hvdcls.data.batches import EpochBatches
    from hvdcls.data.sharding import eval_batches
    from hvdcls.data.transforms import Preprocess

    data = datasets.open_data(run.config)
    preprocess = Preprocess(run.config.data, run.config.training.seed, data.augment.get("preset"))
    return EpochBatches(data.val, eval_batches(len(data.val), 1, 0, run.config.training.batch_size),
                        preprocess, 0, train=False)
