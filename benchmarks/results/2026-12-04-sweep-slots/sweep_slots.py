"""Issue 29's target: a 12-trial sweep (two trials at a time, pruning) against the full grid of
the same space, on the digits, through a real `hvdcls serve` (2 slots) on this machine.

    python sweep_slots.py OUT_DIR [SEED ...]

The grid: every point (24) of optimizer.lr x training.batch_size x optimizer.weight_decay, each
trained its 4 epochs (no pruning). Then, per seed, `hvdcls sweep --trials 12 --sampler tpe
--pruner median` over the same space. Slot-seconds: each trial's job's wall time (the
service's started_at to ended_at) x its slots (np=1). Writes OUT_DIR/result.json and prints a
table: the best metric, the slot-seconds and their ratio to the grid's.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
SPACE = ["optimizer.lr=choice(0.01,0.03,0.1,0.3)", "training.batch_size=choice(32,64,128)",
         "optimizer.weight_decay=choice(0,0.0005)", "training.epochs=4", "output.report=false",
         "output.tensorboard=false", "output.checkpoint_every=0"]
HVDCLS = [sys.executable, "-m", "hvdcls"]


def serve(root: Path) -> tuple[subprocess.Popen, str, str]:
    state, port = root / "state", 18700 + os.getpid() % 1000
    (root / "cwd").mkdir(parents=True, exist_ok=True)
    log = open(root / "serve.log", "ab")  # noqa: SIM115 (the service writes it until it ends)
    proc = subprocess.Popen([*HVDCLS, "serve", "--hosts", "localhost:2", "--state-dir", str(state),
                             "--port", str(port), "--grace-seconds", "5"], stdout=log, stderr=subprocess.STDOUT,
                            cwd=root / "cwd")
    while not (state / "server.json").exists():
        assert proc.poll() is None, (root / "serve.log").read_text()[-2000:]
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}", (state / "token").read_text().strip()


def sweep(name: str, out: Path, url: str, token: str, *flags: str) -> dict:
    started = time.time()
    done = subprocess.run([*HVDCLS, "sweep", *SPACE, "--config", str(REPO / "configs" / "digits.yaml"),
                           "--out", str(out / name), "--parallel", "2", "--server", url, "--token", token,
                           "--poll-seconds", "0.5", *flags], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wall = time.time() - started
    trials = json.loads((out / name / "trials.json").read_text())["trials"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        jobs = [http.get(f"/jobs/{t['job_id']}").json() for t in trials if t.get("job_id")]
    slot_seconds = sum((j["ended_at"] - j["started_at"]) * j["spec"].get("np", 1) for j in jobs if j["started_at"])
    finished = [t for t in trials if t["state"] == "done"]
    best = max(finished, key=lambda t: t["value"])
    states = {s: sum(t["state"] == s for t in trials) for s in ("done", "pruned", "failed")}
    return {"name": name, "flags": list(flags), "wall_seconds": round(wall, 1), "slot_seconds": round(slot_seconds, 1),
            "trials": len(trials), "states": states, "best": best["value"], "best_params": best["params"]}


def main(out: Path, seeds: list[int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    proc, url, token = serve(out)
    try:
        grid = sweep("grid", out, url, token, "--sampler", "grid", "--trials", "24", "--pruner", "none", "--seed", "0")
        rows = [grid]
        for seed in seeds:
            rows.append(sweep(f"tpe-median-{seed}", out, url, token, "--sampler", "tpe", "--trials", "12",
                              "--pruner", "median", "--seed", str(seed)))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    for row in rows:
        row["slot_ratio"] = round(row["slot_seconds"] / grid["slot_seconds"], 3)
        row["points_below_grid_best"] = round(100 * (grid["best"] - row["best"]), 2)
        print(f"{row['name']:16} trials {row['trials']:2} {row['states']} best {row['best']:.4f} "
              f"({row['points_below_grid_best']:+.2f} points below the grid's) slot-s {row['slot_seconds']:7.1f} "
              f"({row['slot_ratio']:.2f}x the grid's) wall {row['wall_seconds']:.0f} s", flush=True)
    (out / "result.json").write_text(json.dumps({"space": SPACE, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(s) for s in sys.argv[2:]] or [0])
