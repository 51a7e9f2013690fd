"""training.zero on TensorFlow in one process, in a process without torch: the sharded step's
Horovod ops abort a process where torch and horovod.torch are loaded too, as the whole suite's
collection has them. So the cases (zero_cases.py) run in a pytest of their own."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_the_zero_cases_pass_in_a_process_of_their_own():
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(HERE / "zero_cases.py")], capture_output=True, text=True,
                            timeout=600, cwd=HERE.parents[1])
    assert result.returncode == 0 and "7 passed" in result.stdout.splitlines()[-1], (result.stdout + result.stderr)[-4000:]
