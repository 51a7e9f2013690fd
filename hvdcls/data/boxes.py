"""The random box draw that the random resized crop (hvdcls.data.transforms) and random erasing
(hvdcls.data.autoaugment) share: the Inception recipe's tries at an area fraction and an aspect
ratio, both drawn uniformly (the ratio on a log scale)."""
from __future__ import annotations

import math
from typing import Optional

TRIES = 10


def random_box(first: int, second: int, scale, ratio, rng, whole: bool = True
               ) -> Optional[tuple[int, int, int, int]]:
    """Up to TRIES draws of a box over a `first` x `second` grid covering a fraction in `scale`
    of its area, its sides' ratio (along first / along second) in `ratio`, placed uniformly.
    Returns (offset along first, offset along second, size along first, size along second), or
    None when no try fitted. `whole`: the box may span a whole side (a crop); otherwise it must
    be smaller on both (an erasure leaves something). The order of draws is part of the result:
    a seeded sample's pixels depend on it."""
    area = first * second
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(TRIES):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        along_first, along_second = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        fits = (0 < along_first <= first and 0 < along_second <= second if whole
                else 0 < along_first < first and 0 < along_second < second)
        if fits:
            offset_first = int(rng.integers(0, first - along_first + 1))
            offset_second = int(rng.integers(0, second - along_second + 1))
            return offset_first, offset_second, along_first, along_second
    return None
