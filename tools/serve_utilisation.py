"""Slot utilisation of `hvdcls serve` over one 3-job workload, with and without queue-length
elasticity (issue 18's measurement; docs/serve.md quotes its table).

    python tools/serve_utilisation.py [--hosts localhost:1,127.0.0.1:1,...] [--out runs/serve-utilisation]

The same jobs in the same order, against a real `hvdcls serve` on this machine, twice:

    E   torch, elastic np 4 (min 1, max 4)      submitted first
    F1  torch, np 2                             submitted ARRIVAL s after E's first step
    F2  torch, np 1                             ARRIVAL s after F1

`elastic`: the service resizes E by the queue (a short --resize-cooldown). `fixed`: the same
elastic job under a cool-down longer than the run, so E is never resized and holds its 4 slots
to its end (everything else, Horovod's elastic mode included, is the same). The inventory is
one slot per local host name (a shrink then removes whole hosts, which is what Horovod's
elastic driver handles: NOTES.md). While the workload runs, GET /jobs is sampled every
SAMPLE s; the slots each running job holds, integrated over time, are the slot-seconds used;
the inventory times the makespan (first submit to last end) the slot-seconds available.
Writes OUT/utilisation.json and prints the table as Markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SAMPLE = 0.5  # s between samples of GET /jobs
ARRIVAL = 15.0  # s: F1 after E's first step, F2 after F1
FINAL = ("succeeded", "failed", "cancelled")
VARIANTS = {"elastic": "5", "fixed": "1000000"}  # --resize-cooldown


def job_settings(epochs: int, commit_every: int = 5) -> dict:
    return {"schedule": {"warmup_epochs": 0},
            "training": {"epochs": epochs, "log_every": 1, "commit_every": commit_every}}


# --- the arithmetic (tests/unit/test_serve_utilisation.py) --------------------------------------

def slot_seconds(samples: list[tuple[float, int]], end: float) -> float:
    """Slots held × time: each sample's (time, slots in use) holds until the next sample (the
    last until `end`)."""
    total = 0.0
    for (t, used), (t_next, _) in zip(samples, samples[1:] + [(end, 0)]):
        total += used * max(0.0, min(t_next, end) - t)
    return total


def summarise(jobs: list[dict], samples: list[tuple[float, int]], total_slots: int) -> dict:
    """Makespan, slot-seconds used and available, and each job's wait (submit to start), run
    time, resizes, steps lost and the stall of each resize; `jobs` as GET /jobs gives them, plus
    `steps_lost` and `recoveries` from the job's summary.json."""
    start = min(job["submitted_at"] for job in jobs)
    end = max(job["ended_at"] for job in jobs)
    in_window = [(t, used) for t, used in samples if start <= t <= end]
    used = slot_seconds(in_window, end)
    available = total_slots * (end - start)
    return {
        "makespan_seconds": end - start,
        "slot_seconds_used": used,
        "slot_seconds_available": available,
        "utilisation": used / available if available else 0.0,
        "jobs": {job["name"]: {"wait_seconds": job["started_at"] - job["submitted_at"],
                               "run_seconds": job["ended_at"] - job["started_at"], "state": job["state"],
                               "resizes": job["resizes"], "steps_lost": job.get("steps_lost"),
                               "stalls": [(r["world_size"], r["seconds"]) for r in job.get("recoveries", [])]}
                 for job in jobs},
    }


def wait_and_run(job: str) -> Callable[[dict], str]:
    return lambda r: f"{r['jobs'][job]['wait_seconds']:.0f}, {r['jobs'][job]['run_seconds']:.0f}"


def table(results: dict[str, dict]) -> str:
    """Markdown: one column per variant."""
    names = list(results)
    rows = [("makespan (s)", lambda r: f"{r['makespan_seconds']:.0f}"),
            ("slot-seconds used / available", lambda r: f"{r['slot_seconds_used']:.0f} / "
                                                        f"{r['slot_seconds_available']:.0f}"),
            ("slot utilisation", lambda r: f"{r['utilisation']:.0%}")]
    for job in results[names[0]]["jobs"]:
        rows.append((f"{job}: wait, run (s)", wait_and_run(job)))
    rows.append(("E: resizes, steps lost", lambda r: f"{r['jobs']['E']['resizes']}, {r['jobs']['E']['steps_lost']}"))
    rows.append(("E: seconds without a step at each resize (to N workers)",
                 lambda r: ", ".join(f"{s:.1f} s ({n})" for n, s in r["jobs"]["E"]["stalls"]) or "none"))
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines += [f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |" for label, cell in rows]
    if {"elastic", "fixed"} <= set(results):
        ratio = results["elastic"]["makespan_seconds"] / results["fixed"]["makespan_seconds"]
        lines.append(f"\nmakespan elastic / fixed: {ratio:.2f}; utilisation "
                     f"{results['elastic']['utilisation']:.0%} against {results['fixed']['utilisation']:.0%}")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------------

def local_hosts() -> str:
    """One slot per name this machine answers to (Horovod starts local ones without SSH)."""
    import socket

    import psutil  # Horovod's own dependency

    names = ["localhost", "127.0.0.1"]
    names += [addr.address for addrs in psutil.net_if_addrs().values() for addr in addrs
              if addr.family == socket.AF_INET and not addr.address.startswith("127.")]
    return ",".join(f"{name}:1" for name in names[:4])


class Service:
    """`hvdcls serve` in a fresh state directory; stopped (and its jobs ended) on exit."""

    def __init__(self, hosts: str, cooldown: str, work: Path):
        from hvdcls.launching import launch

        self.state = work / "state"
        (work / "data").mkdir(parents=True, exist_ok=True)
        command = launch.hvdcls_command("serve", "--hosts", hosts, "--state-dir", str(self.state), "--port", "0",
                                        "--data-root", str(work / "data"), "--resize-cooldown", cooldown,
                                        "--network-interface", "lo", "--grace-seconds", "5")
        env = {**launch.single_host_env(), "PYTHONPATH": str(REPO),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        self.log = open(work / "serve.log", "ab")  # noqa: SIM115 (the server writes it until __exit__ closes it)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def __enter__(self):
        import httpx

        deadline = time.time() + 60
        while not (self.state / "server.json").exists():
            if self.process.poll() is not None or time.time() > deadline:
                raise SystemExit(f"hvdcls serve did not start: see {self.log.name}")
            time.sleep(0.2)
        url = json.loads((self.state / "server.json").read_text())["url"]
        token = (self.state / "token").read_text().strip()
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        return self

    def __exit__(self, *exc):
        for job in self.http.get("/jobs", params={"state": "running"}).json():
            self.http.post(f"/jobs/{job['id']}/cancel")
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        self.log.close()

    def submit(self, name: str, np: int, epochs: int, **extra) -> int:
        reply = self.http.post("/jobs", json={"name": name, "np": np, "backend": "torch",
                                              "settings": job_settings(epochs), **extra})
        reply.raise_for_status()
        return reply.json()["id"]


def sample(service: Service, samples: list, until) -> list[dict]:
    """Sample the slots in use until `until(jobs)`; the last GET /jobs."""
    while True:
        jobs = service.http.get("/jobs").json()
        samples.append((time.time(), sum(sum(j["hosts"].values()) for j in jobs if j["state"] == "running"
                                         and j["hosts"])))
        if until(jobs):
            return jobs
        time.sleep(SAMPLE)


def run_variant(hosts: str, cooldown: str, work: Path, epochs: dict[str, int]) -> dict:
    samples: list[tuple[float, int]] = []
    with Service(hosts, cooldown, work) as service:
        service.submit("E", 4, epochs["E"], elastic=True, min_np=1, max_np=4)
        sample(service, samples, lambda jobs: jobs[0]["first_step_at"] is not None)
        arrival = time.time()
        for name, np in (("F1", 2), ("F2", 1)):
            arrival += ARRIVAL
            sample(service, samples, lambda _, due=arrival: time.time() >= due)
            service.submit(name, np, epochs[name])
        jobs = sample(service, samples, lambda jobs: all(j["state"] in FINAL for j in jobs))
    for job in jobs:
        summary = Path(job["run_dir"]) / "summary.json"
        elastic = json.loads(summary.read_text()).get("elastic") if summary.exists() else None
        job["steps_lost"] = elastic["steps_lost"] if elastic else None
        job["recoveries"] = elastic["recoveries"] if elastic else []
    result = summarise(jobs, samples, total_slots=len(hosts.split(",")))
    result["job_ids"] = {job["name"]: job["id"] for job in jobs}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", help="HOST:1,... four local names (default: this machine's)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "serve-utilisation")
    parser.add_argument("--epochs", type=int, nargs=3, default=[30, 8, 8], metavar=("E", "F1", "F2"))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args(argv)
    hosts = args.hosts or local_hosts()
    epochs = dict(zip(("E", "F1", "F2"), args.epochs))
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for variant in args.variants:
        work = Path(tempfile.mkdtemp(prefix=f"serve-{variant}-", dir=args.out))
        print(f"{variant}: {hosts}, epochs {epochs}, in {work}", flush=True)
        results[variant] = run_variant(hosts, VARIANTS[variant], work, epochs)
        print(json.dumps(results[variant], indent=1), flush=True)
    record = {"hosts": hosts, "epochs": epochs, "arrival_seconds": ARRIVAL, "results": results,
              "load_average_after": os.getloadavg()}
    (args.out / "utilisation.json").write_text(json.dumps(record, indent=1) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
