"""CPU seconds of one `hvdcls.config.load` of a digits job's settings (what `POST /jobs`
validates per spec): 30 loads after one warm-up, the median of their process times. From the
repository root: python benchmarks/results/2026-12-06-serve-load/config_load.py > .../config_load.txt"""
import statistics
import time

from hvdcls.config import load


def main() -> None:
    settings = {"data": {"name": "digits"}, "training": {"epochs": 2}}
    load(settings=settings)
    times = []
    for _ in range(30):
        start = time.process_time()
        load(settings=settings)
        times.append(time.process_time() - start)
    print(f"config load, CPU seconds per spec: median {statistics.median(times):.3f}, "
          f"min {min(times):.3f}, max {max(times):.3f}")


if __name__ == "__main__":
    main()
