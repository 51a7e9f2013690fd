"""`hvdcls bench`: training-step throughput over a matrix, next to DDP and raw Horovod loops.

    hvdcls bench                                   # the default matrix (make bench)
    hvdcls bench --backends torch --np 1 2 --compression none fp16 --batch-size 16 32 \\
        --model resnet50 --image-size 64 --output-dir runs/bench

Each cell is its own launch (`horovodrun --gloo -np N -H localhost:N`; for the frameworks' own
data parallelism, hvdcls.bench.peers: `torchrun` for DDP, TF_CONFIG workers for TensorFlow's
MultiWorkerMirroredStrategy) of a worker that times steps on a batch held in memory
(hvdcls.bench.worker; benchmarks/*.py for the baselines, which use no hvdcls code). Warm-up
steps are excluded, each cell is measured `--reps` times and the median is reported with the
min-max spread. Every cell of one bench run
gets the same threads per process and the same Horovod fusion/cycle settings, so ratios within
one run compare like with like: hvdcls / raw Horovod (what our interface costs) and
Horovod / its peer, DDP or MultiWorkerMirroredStrategy (Horovod against the framework's own
data parallelism).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import typing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

from hvdcls import models, registry
from hvdcls.backend import usable_cores
from hvdcls.bench import data as bench_data
from hvdcls.bench import guard, peers, sharding, slow, tensor
from hvdcls.bench.processes import launch_group, machine, terminate_unwinds
from hvdcls.config import Compression, HorovodConfig, Wait
from hvdcls.errors import UserError
from hvdcls.files import fileio
from hvdcls.flags import option
from hvdcls.launching import gpu, horovod_env, launch
from hvdcls.maths import zero

BASELINES_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
BASELINE_SCRIPTS = {("raw-horovod", "torch"): "raw_horovod_torch.py",
                    ("raw-horovod", "tensorflow"): "raw_horovod_tf.py",
                    ("ddp", "torch"): "ddp_torch.py",
                    ("mwms", "tensorflow"): "mwms_tf.py"}
BASELINE_RUNNERS = ("raw-horovod", *peers.PEERS.values())
BYTES_PER_ELEMENT = {"none": 4, "fp16": 2}
COMPRESSIONS = typing.get_args(Compression)  # what horovod.compression accepts
# Raw Horovod has no PowerSGD; DDP has its own (torch.distributed's powerSGD_hook); MWMS no compression.
NO_BASELINE = {("raw-horovod", "powersgd"), *peers.UNSUPPORTED}
WAITS = typing.get_args(Wait)  # what horovod.wait accepts


@dataclass
class BenchSpec:
    """What to measure; each field is also its `hvdcls bench` flag (hvdcls.flags), in this order."""

    backends: list[str] = option(["torch", "tensorflow"], choices=registry.names())
    nps: list[int] = option([1, 2], flag="--np", help="process counts")
    compressions: list[str] = option(["none", "fp16"], flag="--compression", choices=COMPRESSIONS,
                                     help="np=1 runs uncompressed only; powersgd has a DDP baseline, "
                                     "no raw-Horovod one")
    powersgd_rank: int = 4
    powersgd_fp16: bool = option(False, help="powersgd: hvdcls all-reduces P and Q in float16 "
                                 "(horovod.powersgd.fp16); DDP's hook keeps float32")
    batch_sizes: list[int] = option([16], flag="--batch-size", help="per worker")
    models: list[str] = option(["resnet50"], flag="--model")
    image_size: int = 64
    warmup: int = option(3, flag="--warmup-steps", old=("--warmup",), help="untimed steps first")
    steps: int = option(10, help="timed steps per repetition")
    reps: int = option(3, help="repetitions (median, spread)")
    # Drift hits every cell alike.
    rounds: int = option(1, help="run the whole matrix this many times, interleaved, pooling the "
                         "repetitions (evens out a drifting machine)")
    baselines: bool = option(True, help="skip the baseline loops (raw Horovod, DDP, MWMS)")  # --no-baselines
    baseline_runners: list[str] = option(list(BASELINE_RUNNERS), choices=BASELINE_RUNNERS,
                                         help="which baselines run beside the hvdcls cells "
                                         "(ddp: torch, mwms: TensorFlow's MultiWorkerMirroredStrategy)")
    # `hvdcls train`'s defaults (NOTES: 16-32 MB and 5-10 ms suit this machine)
    fusion_threshold_mb: float = horovod_env.DEFAULTS["fusion_threshold_mb"]
    cycle_time_ms: float = horovod_env.DEFAULTS["cycle_time_ms"]
    timeout: int = option(900, flag=None)  # seconds per launch; no flag
    link_mbit: Optional[float] = option(None, help="run the np=2 cells across two network namespaces "
                                        "joined by a link shaped to this rate (root; e.g. 1000, 10000)")
    link_delay_ms: float = option(0.0, help="one-way delay on that link")
    # Across a shaped link: the all-reduce sweep also times one step's gradients of the first
    # model under each fusion threshold x cycle time (one launch each; Horovod reads them at init;
    # a threshold of 0 turns fusion off).
    sweep_fusion_mb: list[float] = option([0.0, 4.0, 32.0, 128.0], help="with --link-mbit: fusion "
                                          "thresholds to time a step's gradients under (0: no fusion)")
    sweep_cycle_ms: list[float] = option([1.0, 5.0, 20.0], help="with --link-mbit: cycle times, "
                                         "crossed with --sweep-fusion-mb")
    # --loader: --data is the data set in hvdcls train; --data here was its old name
    data: list[str] = option(["memory"], flag="--loader", old=("--data",), choices=bench_data.DATA_MODES,
                             help="memory: one batch reused; imagefolder/lmdb: JPEGs written for "
                             "the run, read through the real loader")
    loader_workers: int = option(2, help="loader workers per rank in imagefolder/lmdb cells")
    device: str = option("cpu", choices=("cpu", "cuda"),
                         help="cuda: float16 AMP, channels-last (torch); needs an NVIDIA GPU")
    balances: list[str] = option(["off"], flag="--balance", choices=("off", "dynamic"),
                                 help="training.balance of the np>1 hvdcls cells (dynamic: per-rank "
                                 "batches by measured speed, memory data only)")
    compiles: list[str] = option(["off"], flag="--compile", choices=("off", "on"),
                                 help="training.compile of the hvdcls cells (on: torch.compile / "
                                 "XLA; its compile runs in untimed steps first)")
    zeros: list[int] = option([0], flag="--zero", choices=zero.LEVELS,
                              help="training.zero of the hvdcls cells (1: optimizer state sharded, "
                              "2: gradients too, 3: parameters too); the baselines run beside zero 0 only")
    activation_checkpointing: bool = option(False, help="training.activation_checkpointing in every "
                                            "hvdcls cell (each block recomputed in backward)")
    tensors: list[int] = option([1], flag="--tensor",
                                help="parallel.tensor of the hvdcls cells (ViTs: np/T replicas of T ranks, "
                                "each block split over a group; a cell needs T to divide np); the "
                                "baselines run beside T=1 only")
    waits: list[str] = option(["auto"], flag="--wait", choices=WAITS,
                              help="horovod.wait of the torch hvdcls cells (sleep: poll the "
                              "all-reduces with naps; spin: Horovod's synchronize(); auto: sleep "
                              "over 16 MB of gradients); TensorFlow's wait is TensorFlow's either way")
    slow_rank: Optional[str] = option(None, help="RANK=FRACTION: that rank of every np>1 cell runs "
                                      "with FRACTION of the CPU of the others (a cgroup; root), "
                                      "e.g. 1=0.5; DDP cells are left out")


@dataclass(frozen=True)
class Cell:
    runner: str  # hvdcls | raw-horovod | ddp
    backend: str
    np: int
    compression: str
    batch_size: int
    model: str
    data: str = "memory"  # memory: one batch held in memory; imagefolder | lmdb: real loader
    balance: str = "off"  # training.balance (hvdcls cells with np > 1)
    compile: str = "off"  # training.compile (hvdcls cells)
    zero: int = 0  # training.zero (hvdcls cells)
    wait: str = "auto"  # horovod.wait (torch hvdcls cells; the baselines keep the default label)
    tensor: int = 1  # parallel.tensor (hvdcls cells)

    def key(self) -> tuple:
        return (self.backend, self.np, self.compression, self.batch_size, self.model, self.data,
                self.balance, self.compile, self.zero, self.tensor, self.wait)

    def file_name(self) -> str:
        return f"{self.runner}-{'-'.join(map(str, self.key()))}.json"

    @classmethod
    def of(cls, result: dict) -> "Cell":
        """The cell a result row (or a failed one) was measured for (older reports lack
        the later fields: their defaults)."""
        return cls(**{name: result[name] for name in cls.__dataclass_fields__ if name in result})


def cells(spec: BenchSpec) -> list[Cell]:
    """The matrix, then each baseline that matches one of its cells. One process has nothing to
    compress: np=1 runs uncompressed only, the base of every compression's scaling efficiency."""
    out = [Cell("hvdcls", backend, np, compression, batch, model, data)
           for backend, np, compression, batch, model, data in itertools.product(
               spec.backends, spec.nps, spec.compressions, spec.batch_sizes, spec.models, spec.data)
           if np > 1 or compression == spec.compressions[0]]
    out = [replace(c, compression="none") if c.np == 1 else c for c in out]
    out += [replace(c, balance=balance) for c in list(out) if c.np > 1 and c.data == "memory"
            for balance in spec.balances if balance != "off"]
    # each compiled cell right after its plain one: a round measures the two side by side
    out = [replace(c, compile=mode) for c in out for mode in spec.compiles]
    out = [replace(c, zero=level) for c in out for level in spec.zeros]  # the same, by level
    out = [replace(c, tensor=t) for c in out for t in tensor.tensors_for(c.np, spec.tensors)]  # and by T
    # torch's waits side by side too; TensorFlow's cells have one (it waits in TensorFlow)
    out = [replace(c, wait=wait) for c in out
           for wait in (spec.waits if c.backend == "torch" else spec.waits[:1])]
    if spec.baselines:
        runners = [r for r in spec.baseline_runners if r == "raw-horovod" or not spec.slow_rank]
        if spec.link_mbit:  # the peers that cross the namespaces; the others would not be comparable
            runners = [r for r in runners if r == "raw-horovod" or r in peers.ACROSS_LINK]
        out += [replace(c, runner=runner, wait=Cell.wait) for c in list(out)
                if c.balance == "off" and c.compile == "off" and c.zero == 0 and c.tensor == 1
                and c.wait == spec.waits[0]
                for runner in runners if (runner, c.backend) in BASELINE_SCRIPTS
                and (runner, c.compression) not in NO_BASELINE and plain_loops_build(c.model)
                and c.data != "lmdb"]  # LMDB is our own format: no plain loop reads it
    return out


def plain_loops_build(model: str) -> bool:
    """The baselines build the frameworks' own models (torchvision's, Keras applications), not
    hvdcls's compact_cnn: its cells run without them instead of as failed rows."""
    return models.normalise_name(model) != models.normalise_name(models.COMPACT_CNN)


def threads_per_rank(np: int) -> int:
    return max(1, len(usable_cores()) // np)


def worker_args(cell: Cell, spec: BenchSpec, out: Path) -> list[str]:
    return ["--model", cell.model, "--batch-size", str(cell.batch_size), "--image-size",
            str(spec.image_size), "--compression", cell.compression, "--threads",
            str(threads_per_rank(cell.np)), "--warmup", str(spec.warmup), "--steps", str(spec.steps),
            "--reps", str(spec.reps), "--powersgd-rank", str(spec.powersgd_rank), "--out", str(out),
            "--device", spec.device, *bench_data.data_flags(cell.data, out.parent, spec.loader_workers)]


def hvdcls_worker_args(cell: Cell, spec: BenchSpec, out: Path) -> list[str]:
    """hvdcls.bench.worker's flags: the baselines' and the settings only hvdcls has."""
    fp16_factors = ["--powersgd-fp16"] if spec.powersgd_fp16 and cell.compression == "powersgd" else []
    return ["--backend", cell.backend, *worker_args(cell, spec, out), "--balance", cell.balance,
            "--compile", cell.compile, "--zero", str(cell.zero), "--tensor", str(cell.tensor),
            "--wait", cell.wait, *fp16_factors,
            *(["--activation-checkpointing"] if spec.activation_checkpointing else [])]


def command(cell: Cell, spec: BenchSpec, out: Path, hosts=None, throttle=None) -> list[str]:
    """The cell's launch; `throttle`: (cgroup, rank) whose process runs inside that cgroup."""
    args = worker_args(cell, spec, out)
    if cell.runner == "hvdcls":
        program = [sys.executable, "-m", "hvdcls.bench.worker", *hvdcls_worker_args(cell, spec, out)]
    else:
        program = [sys.executable, str(BASELINES_DIR / BASELINE_SCRIPTS[(cell.runner, cell.backend)]), *args]
    if cell.runner in peers.PEERS.values():
        return peers.command(cell.runner, cell.np, program, hosts)
    if throttle is not None and cell.np > throttle[1]:
        program = slow.wrap(program, *throttle)
    if cell.np == 1:
        return program
    if hosts is not None:  # one rank per namespace "host", every byte over the shaped link
        return hosts.horovodrun(cell.np, program, launch.horovodrun_tool())
    return launch.horovodrun(cell.np, program)


def environment(cell: Cell, spec: BenchSpec) -> dict[str, str]:
    env = launch.single_host_env(threads_per_rank(cell.np))
    env["OMP_NUM_THREADS"] = str(threads_per_rank(cell.np))
    # Set in the environment, so the baselines (which use no hvdcls code) run under them too.
    fusion = HorovodConfig(fusion_threshold_mb=spec.fusion_threshold_mb, cycle_time_ms=spec.cycle_time_ms)
    env.update(horovod_env.variables(fusion, keys=("fusion_threshold_mb", "cycle_time_ms")))
    return env


def run_cell(cell: Cell, spec: BenchSpec, scratch: Path, hosts=None, throttle=None) -> dict:
    """One launch of one cell: the worker's raw JSON with the CPU used outside the bench
    meanwhile (hvdcls.bench.guard), or {"error": ...}."""
    out = scratch / cell.file_name()
    out.unlink(missing_ok=True)
    slow_rank = spec_slow(spec)
    if throttle is not None and slow_rank is not None:  # the slow rank gets FRACTION of each rank's share
        slow.set_threads(throttle[0], slow_rank.fraction, threads_per_rank(cell.np))
    ours = guard.own_seconds if hosts is None else lambda: guard.own_seconds() + hosts.cpu_seconds()
    with guard.CpuGuard(ours=ours) as watch:
        result = launch_group(command(cell, spec, out, hosts, throttle), environment(cell, spec),
                              spec.timeout)
    if result.returncode != 0 or not out.exists():
        return {"error": failure(result)}
    return {**json.loads(out.read_text()), "outside": [watch.outside]}


BASELINE_REFUSED = "bench baseline: error: "  # benchmarks/tf_step.py's one line for a model it has not


def failure(result: subprocess.CompletedProcess) -> str:
    """A failed launch in one line: the worker's or a baseline's refusal where it gave one
    (every rank gives the same), else the output's last lines."""
    from hvdcls.bench.worker import REFUSED

    lines = (result.stdout + result.stderr).strip().splitlines()
    refused = [line.split(prefix, 1)[1] for line in lines for prefix in (REFUSED, BASELINE_REFUSED) if prefix in line]
    return f"exit {result.returncode}: " + (refused[0] if refused else " | ".join(lines[-5:]))


def spec_slow(spec: BenchSpec) -> Optional[slow.SlowRank]:
    return slow.SlowRank.parse(spec.slow_rank) if spec.slow_rank else None


REPEATED = ("step_seconds", "allreduce_wait_seconds", "images_per_sec", "data_wait_seconds",
            "tensor_parallel_seconds")


def merge_rounds(raws: list[dict]) -> dict:
    """One raw result from several rounds: the repetitions of every round together."""
    merged = dict(raws[0])
    merged["outside"] = [stretch for raw in raws for stretch in raw.get("outside", [])]
    merged["round_medians"] = [statistics.median(raw["images_per_sec"]) for raw in raws]
    for name in REPEATED:
        if name in merged:
            merged[name] = [value for raw in raws for value in raw[name]]
    return merged


def run_matrix(todo: list[Cell], spec: BenchSpec, scratch: Path, hosts, bar,
               throttle=None) -> list[dict]:
    """Every cell `spec.rounds` times, round by round; a cell that fails is not run again."""
    raws: dict[Cell, list[dict]] = {cell: [] for cell in todo}
    errors: dict[Cell, str] = {}
    for _ in range(spec.rounds):
        for cell in todo:
            if cell not in errors:
                raw = run_cell(cell, spec, scratch, hosts, throttle)
                if "error" in raw:
                    errors[cell] = raw["error"]
                else:
                    raws[cell].append(raw)
            bar.update()
    return [{**asdict(cell), "error": errors[cell]} if cell in errors
            else summarise(cell, merge_rounds(raws[cell])) for cell in todo]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(cell: Cell, raw: dict) -> dict:
    step = statistics.median(raw["step_seconds"])
    data_wait = statistics.median(raw["data_wait_seconds"]) if raw.get("data_wait_seconds") else None
    waits = raw["allreduce_wait_seconds"]
    wait = None if any(w is None for w in waits) else statistics.median(waits)
    # What each rank hands to the all-reduce per step (as the worker counted it, else from the
    # parameters); a ring moves 2(N-1)/N of it per rank.
    buffer = raw.get("allreduce_bytes_per_step")
    if buffer is None and cell.compression in BYTES_PER_ELEMENT:
        buffer = raw["parameters"] * BYTES_PER_ELEMENT[cell.compression]
    return {**asdict(cell), "threads_per_rank": raw["threads"], "parameters": raw["parameters"],
            "images_per_sec": spread(raw["images_per_sec"]),
            "images_per_sec_by_round": raw.get("round_medians"),  # each round's median
            "images_per_sec_per_worker": statistics.median(raw["images_per_sec"]) / cell.np,
            "step_seconds": spread(raw["step_seconds"]),
            "allreduce_wait_seconds": wait,
            "communication_share": None if wait is None else wait / step,
            "loader_workers": raw.get("loader_workers"), "device": raw.get("device", "cpu"),
            "data_wait_seconds": data_wait,
            "data_wait_share": None if data_wait is None else data_wait / step,
            "allreduce_bytes_per_step": None if buffer is None else buffer if cell.np > 1 else 0,
            "ring_bytes_sent_per_rank": None if buffer is None else int(buffer * 2 * (cell.np - 1) / cell.np),
            "horovod_settings": raw.get("horovod_settings", {}), "versions": raw.get("versions", {}),
            "allocator": raw.get("allocator"),  # hvdcls's ranks: hvdcls/launching/allocator.py
            "balance_plan": (raw.get("balance") or {}).get("batches"),
            "first_step_seconds": raw.get("first_step_seconds"),
            # rank 0's tensors and peak RSS, and every rank's (hvdcls.training.memory)
            "memory": raw.get("memory"), "rank_memory": raw.get("rank_memory"),
            # the peer's own settings: DDP's buckets and hook, MWMS's collective and its checks
            "runner_settings": raw.get("ddp") or raw.get("mwms"),
            **tensor.summarise(raw, step), **guard.summarise(raw.get("outside", []))}


def by_round(mine: dict, other: Optional[dict]) -> Optional[list[float]]:
    """Round r's median over the other cell's round r median, for each round both ran: the
    rounds are interleaved, so each pair was measured minutes apart, not a run apart."""
    ours, theirs = mine.get("images_per_sec_by_round"), (other or {}).get("images_per_sec_by_round")
    if not ours or not theirs or len(ours) != len(theirs):
        return None
    return [a / b for a, b in zip(ours, theirs)]


def add_ratios(results: list[dict]) -> None:
    """Scaling efficiency against np=1 of the same runner, and the cross-runner ratios; for
    training.zero, the speed and the sharded bytes against zero 0 and the bytes against np=1."""
    good = {(r["runner"], Cell.of(r).key()): r for r in results if "error" not in r}
    speed = {key: r["images_per_sec"]["median"] for key, r in good.items()}
    for r in results:
        if "error" in r:
            continue
        cell = Cell.of(r)
        key = cell.key()
        mine = speed[(r["runner"], key)]
        # against one rank at T=1 for every T (parallel.tensor's efficiency, issue 50)
        single_key = (r["runner"], replace(cell, np=1, compression="none", balance="off", tensor=1).key())
        single = speed.get(single_key)
        baseline_key = replace(cell, wait="auto").key()  # the label the baselines' cells keep
        peer_key = (peers.peer(r["backend"]), baseline_key)
        raw, peer = speed.get(("raw-horovod", baseline_key)), speed.get(peer_key)
        r["scaling_efficiency"] = mine / (r["np"] * single) if single else None
        r["vs_raw_horovod"] = mine / raw if raw and r["runner"] == "hvdcls" else None
        # against the framework's own data parallelism: DDP for torch, MWMS for TensorFlow
        r["peer"] = peers.peer(r["backend"])
        r["horovod_vs_peer"] = mine / peer if peer and r["runner"] in ("hvdcls", "raw-horovod") else None
        r["horovod_vs_peer_by_round"] = by_round(r, good.get(peer_key)) if r["horovod_vs_peer"] is not None else None
        off = speed.get((r["runner"], replace(cell, balance="off").key()))
        r["vs_balance_off"] = mine / off if off and r["balance"] != "off" else None
        plain = speed.get((r["runner"], replace(cell, compile="off").key()))
        r["vs_compile_off"] = mine / plain if plain and r["compile"] != "off" else None
        spun = speed.get((r["runner"], replace(cell, wait="spin").key()))
        r["vs_wait_spin"] = mine / spun if spun and r["runner"] == "hvdcls" and cell.wait != "spin" else None
        twin = good.get((r["runner"], replace(cell, zero=0).key())) if cell.zero else None
        sharding.add_ratios(r, twin, good.get(single_key) if cell.np > 1 else None)
        tensor.add_ratios(r, good.get((r["runner"], replace(cell, tensor=1).key())) if cell.tensor > 1 else None)


def shaped_hosts(spec: BenchSpec):
    """Two namespace hosts over a shaped link when asked for (hvdcls.bench.netns), else nothing."""
    if not spec.link_mbit:
        return contextlib.nullcontext(None)
    if any(n not in (1, 2) for n in spec.nps):
        raise UserError("--link-mbit runs one rank on each of two hosts: use --np 1 2")
    from hvdcls.bench.netns import Link, ShapedHosts
    return ShapedHosts(Link(spec.link_mbit, spec.link_delay_ms))


def throttled(spec: BenchSpec):
    """(cgroup, slow rank) for --slow-rank (hvdcls.bench.slow), else nothing."""
    chosen = spec_slow(spec)
    if chosen is None:
        return contextlib.nullcontext(None)
    return slow.throttled_cgroup(chosen)


def sweep_settings(spec: BenchSpec) -> list[tuple[float, float]]:
    """(fusion MB, cycle ms) for each sweep launch; the bench's own settings first."""
    grid = [(spec.fusion_threshold_mb, spec.cycle_time_ms)]
    return grid + [pair for pair in itertools.product(spec.sweep_fusion_mb, spec.sweep_cycle_ms)
                   if pair not in grid]


def sweep_once(spec: BenchSpec, hosts, scratch: Path, fusion_mb: float, cycle_ms: float,
               message_sizes: bool) -> dict:
    out = scratch / f"sweep-{fusion_mb:g}-{cycle_ms:g}.json"
    program = [sys.executable, str(BASELINES_DIR / "allreduce_sweep.py"), "--model", spec.models[0],
               "--out", str(out)] + ([] if message_sizes else ["--sizes-mb"])
    env = environment(Cell("raw-horovod", "torch", 2, "none", 0, ""),
                      replace(spec, fusion_threshold_mb=fusion_mb, cycle_time_ms=cycle_ms))
    result = launch_group(hosts.horovodrun(2, program, launch.horovodrun_tool()), env, spec.timeout)
    if result.returncode != 0 or not out.exists():
        return {"error": " | ".join((result.stdout + result.stderr).strip().splitlines()[-5:])}
    return json.loads(out.read_text())


def allreduce_sweep(spec: BenchSpec, hosts, scratch: Path) -> dict:
    """Bus bandwidth of Horovod's all-reduce across the link against the link's own rate: single
    messages by size, then one step's gradients of the first model per fusion threshold x cycle
    time."""
    assert spec.link_mbit is not None  # sweeps run only across a shaped link
    link_gbit = spec.link_mbit / 1000
    report: dict = {"link": hosts.link.describe(), "link_gbit_per_s": link_gbit, "gradients": []}
    for index, (fusion_mb, cycle_ms) in enumerate(sweep_settings(spec)):
        one = sweep_once(spec, hosts, scratch, fusion_mb, cycle_ms, message_sizes=index == 0)
        if "error" in one:
            report["gradients"].append({"fusion_mb": fusion_mb, "cycle_ms": cycle_ms, "error": one["error"]})
            continue
        if index == 0:
            report.update(world_size=one["world_size"], sweep=one["sweep"])
        report["gradients"].append({"fusion_mb": fusion_mb, "cycle_ms": cycle_ms, **one["gradients"]})
    for row in report.get("sweep", []) + report["gradients"]:
        if "bus_gbit_per_s" in row:
            row["share_of_link"] = row["bus_gbit_per_s"] / link_gbit
    if "sweep" not in report:
        report["error"] = report["gradients"][0]["error"]
    return report


def validate(spec: BenchSpec) -> None:
    """A bad flag is one line before anything is launched."""
    counts = {"--np": spec.nps, "--batch-size": spec.batch_sizes, "--steps": [spec.steps],
              "--reps": [spec.reps], "--rounds": [spec.rounds], "--image-size": [spec.image_size],
              "--powersgd-rank": [spec.powersgd_rank]}
    for flag, values in counts.items():
        if any(v < 1 for v in values):
            raise UserError(f"{flag} {' '.join(map(str, values))}: must be at least 1")
    for backend in spec.backends:  # every bench has hvdcls cells: their ranks import the binding
        registry.require(backend)
    not_negative: dict[str, list] = {"--warmup-steps": [spec.warmup], "--loader-workers": [spec.loader_workers],
                    "--fusion-threshold-mb": [spec.fusion_threshold_mb],
                    "--sweep-fusion-mb": spec.sweep_fusion_mb}
    for flag, values in not_negative.items():
        if any(v < 0 for v in values):
            raise UserError(f"{flag} {' '.join(f'{v:g}' for v in values)}: must be 0 or more")
    if spec.cycle_time_ms <= 0 or any(v <= 0 for v in spec.sweep_cycle_ms):
        raise UserError("--cycle-time-ms and --sweep-cycle-ms must be above 0")
    unknown = sorted(set(spec.compressions) - set(COMPRESSIONS))
    if unknown:
        raise UserError(f"--compression {' '.join(unknown)}: use {', '.join(COMPRESSIONS)}")
    if spec.slow_rank:
        chosen = slow.SlowRank.parse(spec.slow_rank)
        if not any(n > chosen.rank for n in spec.nps):
            raise UserError(f"--slow-rank {spec.slow_rank}: no cell has a rank {chosen.rank} "
                            f"(--np {' '.join(map(str, spec.nps))})")
    if "dynamic" in spec.balances and (max(spec.nps) < 2 or "memory" not in spec.data):
        raise UserError("--balance dynamic balances np>1 cells on memory data: add --np 2 "
                        "and --loader memory")
    tensor.check_values(spec.tensors, spec.nps)  # before the cells: each T divides some np
    # on memory data: where the images come from is no part of what training.zero serves
    sharding.refuse_unservable(spec.zeros, spec.device, [
        (cell, hvdcls_worker_args(replace(cell, data="memory"), spec, Path("cell.json")))
        for cell in cells(spec) if cell.runner == "hvdcls" and cell.zero and cell.tensor == 1])
    tensor.refuse_unservable([(cell, hvdcls_worker_args(replace(cell, data="memory"), spec, Path("cell.json")))
                              for cell in cells(spec) if cell.tensor > 1])


def run(spec: BenchSpec, output_dir: Path, progress: bool = True) -> dict:
    from tqdm import tqdm

    from hvdcls.bench.report import write_outputs

    validate(spec)
    if spec.baselines and not BASELINES_DIR.is_dir():
        raise UserError(f"baselines asked for but {BASELINES_DIR} is missing (a source checkout "
                        "has it): pass --no-baselines")
    if spec.device == "cuda":
        gpu.require_nvidia_gpu("--device cuda")
    todo = cells(spec)
    sweep = None
    with terminate_unwinds(), tempfile.TemporaryDirectory(prefix="hvdcls-bench-") as scratch, \
            shaped_hosts(spec) as hosts, throttled(spec) as throttle, \
            tqdm(total=len(todo) * spec.rounds, desc="bench", unit="cell", disable=not progress,
                 file=sys.stderr) as bar:
        bench_data.write_for_spec(spec, Path(scratch))
        results = run_matrix(todo, spec, Path(scratch), hosts, bar, throttle)
        if hosts is not None:
            bar.set_description("all-reduce sweep")
            sweep = allreduce_sweep(spec, hosts, Path(scratch))
    add_ratios(results)
    report = {"machine": machine(), "spec": asdict(spec), "cells": results,
              "best_vs_peer": peers.best_against_peers(results), "allreduce_sweep": sweep}
    output_dir.mkdir(parents=True, exist_ok=True)
    write_outputs(report, output_dir)
    fileio.write_json_atomic(output_dir / "bench.json", report)
    return report
