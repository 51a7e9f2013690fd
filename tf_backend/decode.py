"""data.decode for the TensorFlow backend: JPEGs are decoded on the CPU, in the loader's threads.

Mirror: torch_backend/decode.py. TensorFlow registers its JPEG decoding kernels (DecodeJpeg,
DecodeAndCropJpeg, DecodeImage) for the CPU alone: the installed 2.18 lists no other device for
them, and its sources register none. DALI's TensorFlow plugin decodes on a GPU; hvdcls does not
use it (its package was not installed where this was written, so nothing could be tested).
So data.decode=gpu with this backend is refused with one line, and `auto` decodes on the CPU,
as every run of this backend did before the key existed.
"""
from __future__ import annotations

from typing import Optional


def unsupported() -> Optional[str]:
    """Why this backend cannot decode on its device (hvdcls.data.device_decode.resolve)."""
    return ("the tensorflow backend decodes JPEGs on the CPU (TensorFlow's JPEG kernels have no GPU "
            "version and hvdcls does not use DALI; --backend torch decodes on the GPU)")
