"""One thread, TensorFlow: a rank-4 product of a 512 x 4608 gradient matrix M with a factor Q
(4608 x 4), as written (M @ Q, what tf_backend's PowerSGD computes) and as (Q^T M^T)^T (the
form torch_backend uses), in ms. docs/powersgd.md quotes skinny_tf.txt, what this printed."""
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


def milliseconds(fn, repeats: int = 30) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    matrix, factor = tf.random.normal((512, 4608)), tf.random.normal((4608, 4))
    rounds = [
        (milliseconds(lambda: tf.matmul(matrix, factor).numpy()),
         milliseconds(lambda: tf.transpose(tf.matmul(tf.transpose(factor), tf.transpose(matrix))).numpy()))
        for _ in range(7)
    ]  # alternated, so a change in the machine's load falls on both forms
    as_written, skinny = (statistics.median(r[i] for r in rounds) for i in (0, 1))
    print(f"(512, 4608), median of 7 rounds of 30: M @ Q {as_written:.2f} ms, (Q^T M^T)^T {skinny:.2f} ms")


if __name__ == "__main__":
    main()
