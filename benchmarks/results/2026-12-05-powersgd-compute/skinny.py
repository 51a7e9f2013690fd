"""One thread: a rank-4 product of a gradient matrix M (n x m) with a factor Q (m x 4), as
written (M @ Q) and as (Q^T M^T)^T, in ms, and how far apart the two results are."""
import time

import torch


def milliseconds(fn, repeats: int = 30) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    torch.set_num_threads(1)
    for n, m in [(512, 4608), (2048, 512), (256, 2304), (512, 2048)]:
        matrix, factor = torch.randn(n, m), torch.randn(m, 4)
        as_written = milliseconds(lambda matrix=matrix, factor=factor: matrix @ factor)
        skinny = milliseconds(lambda matrix=matrix, factor=factor: (factor.T @ matrix.T).T)
        a, b = matrix @ factor, (factor.T @ matrix.T).T
        relative = ((a - b).abs().max() / a.abs().max()).item()
        print(f"{(n, m)}: M @ Q {as_written:.3f} ms, (Q^T M^T)^T {skinny:.3f} ms, "
              f"largest difference {relative:.1e} of the largest element")


if __name__ == "__main__":
    main()
