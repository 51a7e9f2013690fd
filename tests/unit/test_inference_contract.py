"""What both backends' exports and weights loaders share (hvdcls.inference.contract,
hvdcls.pretrained): the export check, and rank 0's outcome reaching every rank."""
import numpy as np
import pytest

from hvdcls import pretrained
from hvdcls.errors import UserError
from hvdcls.inference.contract import EXPORT_TOLERANCE, check_export


def test_an_export_within_tolerance_passes_and_beyond_it_is_one_line():
    expected = np.zeros((2, 3), np.float32)
    assert check_export("onnx", expected, expected + 1e-5)["max_abs_diff"] == pytest.approx(1e-5)
    with pytest.raises(UserError, match=r"the onnx export's outputs differ from the model's by 0.001 "):
        check_export("onnx", expected, expected + 1e-3)
    with pytest.raises(UserError, match="differ"):
        check_export("onnx", expected, expected + np.nan)  # NaN is no match
    with pytest.raises(UserError, match=r"shape \(2, 4\)"):
        check_export("keras", expected, np.zeros((2, 4), np.float32))
    assert EXPORT_TOLERANCE == 1e-4


def test_rank_zeros_outcome_reaches_every_rank_errors_included():
    """A stand-in for broadcast_object: what rank 0 sends, every rank gets."""
    sent = {}

    def share_from(rank):
        def share(value, name):
            if rank == 0:
                sent[name] = value
            return sent[name]
        return share

    reads = []

    def load():
        reads.append(1)
        return {"replaced": ["fc: 1000 -> 10 classes"]}

    assert pretrained.read_on_rank0(load, 0, share_from(0)) == {"replaced": ["fc: 1000 -> 10 classes"]}
    assert pretrained.read_on_rank0(load, 1, share_from(1)) == {"replaced": ["fc: 1000 -> 10 classes"]}
    assert len(reads) == 1  # only rank 0 read

    def broken():
        raise UserError("model.weights=x.pth does not fit resnet18: fc.weight ...")

    for rank in (0, 1):
        with pytest.raises(UserError, match="does not fit resnet18"):
            pretrained.read_on_rank0(broken if rank == 0 else load, rank, share_from(rank))
    assert len(reads) == 1  # rank 1 never read: it raised rank 0's error
    assert pretrained.read_on_rank0(load, 3, None) and len(reads) == 2  # elastic: every rank reads
