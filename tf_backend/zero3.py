"""training.zero=3 for the TensorFlow backend: not built yet (issue 49).

Mirror: torch_backend/zero3.py, which shards the parameters block by block and gathers each
block in a forward hook. A per-block gather inside Keras 3's compiled step is not written
yet, so this backend refuses the level with one line (docs/training.md).
"""
from __future__ import annotations

from hvdcls.errors import UserError

REFUSAL = "training.zero=3 is not built for the TensorFlow backend yet; use the torch backend or training.zero=2"


def refuse() -> None:
    raise UserError(REFUSAL)
