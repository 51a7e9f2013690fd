"""A host lost from an elastic job, on one machine: torch, the digits, np 4 over two names of this
machine (localhost:2, 127.0.0.1:2), committing every 2 steps. Once rank 0 prints step STEP of
epoch 1, ranks 2 and 3 are SIGKILLed (rank 3 DELAY seconds after rank 2) and their name leaves
the discovery output. Prints whether the job ended 0 and whether Gloo's size check aborted a rank.

    DELAY=0.2 python repro.py RUNS STEP HOROVOD_CACHE_CAPACITY=1024
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from hvdcls.launching import launch
from tests.parallel.test_elastic import discovery
from tests.parallel.test_train import NO_PICTURES

DIGITS = str(Path(__file__).resolve().parents[3] / "configs" / "digits.yaml")
DELAY = float(os.environ.get("DELAY", "0"))


def host_and_rank(process: psutil.Process) -> tuple:
    try:
        environ = process.environ()
    except psutil.Error:
        return None, None
    return environ.get("HOROVOD_HOSTNAME"), environ.get("HOROVOD_RANK")


def lose_a_host(job: subprocess.Popen, hosts: Path) -> str:
    ranks = [(p, *host_and_rank(p)) for p in psutil.Process(job.pid).children(recursive=True)
             if "train" in " ".join(p.cmdline())]
    victims = sorted((p for p, _, rank in ranks if rank in ("2", "3")), key=lambda p: host_and_rank(p)[1])
    kept = {host for _, host, rank in ranks if rank in ("0", "1")}
    hosts.write_text("".join(f"{host}:2\n" for host in kept))
    for n, victim in enumerate(victims):
        if n:
            time.sleep(DELAY)
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    return f"### killed {[p.pid for p in victims]}, kept {kept}\n"


def run_once(step: int, env: dict) -> tuple[int, bool, bool]:
    tmp = Path(tempfile.mkdtemp(prefix="host-loss-", dir="/tmp"))
    hosts, script = discovery(tmp, "localhost:2\n127.0.0.1:2\n")
    command = launch.hvdcls_command(
        "train", "--backend", "torch", "--config", DIGITS, "--output-dir", str(tmp / "run"), "--epochs", "2",
        "training.elastic=true", "training.commit_every=2", "training.log_every=1", "schedule.warmup_epochs=0",
        "output.progress=lines", *NO_PICTURES)
    job = subprocess.Popen(launch.horovodrun_elastic(4, 2, 4, str(script), command, network_interface="lo"),
                           env={**launch.single_host_env(), **env}, cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, killed = [], False
    for line in job.stdout:
        lines.append(line)
        if not killed and re.search(rf"epoch 1/2 step {step}/", line):
            lines.append(lose_a_host(job, hosts))
            killed = True
    job.wait()
    output = "".join(lines)
    (tmp / "out.txt").write_text(output)
    return job.returncode, killed, "EnforceNotMet" in output or "preamble" in output


def main() -> None:
    runs, step = int(sys.argv[1]), int(sys.argv[2])
    env = dict(arg.split("=", 1) for arg in sys.argv[3:])
    for i in range(runs):
        returncode, killed, enforce = run_once(step, env)
        print(f"run {i}: rc {returncode} killed {killed} enforce {enforce}", flush=True)


if __name__ == "__main__":
    main()
