"""The probes of test_balance.py and test_sync_bn.py in one launch per backend (the `probes`
fixture of tests/parallel/conftest.py), so the ranks start the framework and Horovod once:

    python -m tests.parallel.probes BACKEND OUT_DIR   (on every rank)

writes OUT_DIR/balance/rank-N.json (balance_probe.py), then OUT_DIR/sync_bn/rank-N.json
(sync_bn_probe.py). The balancing probe goes first: it builds backends, and TensorFlow's
threads can be set only before its runtime starts.
"""
import sys
from pathlib import Path

from tests.parallel import balance_probe, sync_bn_probe

PROBES = {"balance": balance_probe.main, "sync_bn": sync_bn_probe.main}  # in this order

if __name__ == "__main__":
    backend, out = sys.argv[1], Path(sys.argv[2])
    for name, probe in PROBES.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        probe(backend, out / name)
