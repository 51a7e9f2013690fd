"""bench.md and bench.png from a `hvdcls bench` report (matplotlib's Figure with Agg: no pyplot
state, no display needed)."""
from __future__ import annotations

from pathlib import Path

from hvdcls import tables
from hvdcls.bench.guard import BUSY_SHARE
from hvdcls.bench.sharding import SHARDED
from hvdcls.files import fileio

COLUMNS = ["runner", "backend", "np", "compression", "batch", "model", "data", "balance", "compile",
           "zero", "tensor", "wait", "img/s (median)", "spread", "img/s/worker", "scaling eff.", "step ms",
           "1st step s", "allreduce wait", "TP share", "data wait", "MB/step", "TP MB/step", "vs raw Horovod",
           "Horovod/peer", "by round", "vs balance off", "vs compile off", "vs zero 0", "vs wait spin",
           "vs tensor 1", "param MB", "grad MB", "opt state MB", "peak RSS MB", "opt state vs np=1",
           "grad vs np=1", "act MB", "param vs T=1", "act vs T=1", "outside CPU"]
MEMORY = ("param_bytes", "grad_bytes", "optimizer_state_bytes", "peak_rss_bytes")  # rank 0's


def fmt(value, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def megabytes(num_bytes):
    return None if num_bytes is None else num_bytes / 1e6


def row(cell: dict) -> list[str]:
    head = [cell["runner"], cell["backend"], str(cell["np"]), compression_label(cell),
            str(cell["batch_size"]), cell["model"], data_label(cell), balance_label(cell),
            cell.get("compile", "off"), str(cell.get("zero", 0)), str(cell.get("tensor", 1)), wait_setting(cell)]
    if "error" in cell:
        return head + [f"failed: {cell['error'][:80]}"] + [""] * (len(COLUMNS) - len(head) - 1)
    ips = cell["images_per_sec"]
    return head + [fmt(ips["median"], "{:.1f}"), f"{ips['min']:.1f}-{ips['max']:.1f}",
                   fmt(cell["images_per_sec_per_worker"], "{:.1f}"), fmt(cell["scaling_efficiency"]),
                   fmt(cell["step_seconds"]["median"] * 1000, "{:.0f}"),
                   fmt(cell.get("first_step_seconds"), "{:.1f}"),
                   fmt(cell["communication_share"], "{:.0%}"), fmt(cell.get("tensor_parallel_share"), "{:.0%}"),
                   fmt(cell.get("data_wait_share"), "{:.0%}"),
                   fmt(megabytes(cell["allreduce_bytes_per_step"]), "{:.2f}"),
                   fmt(megabytes(cell.get("tensor_parallel_bytes_per_step")), "{:.2f}"),
                   fmt(cell["vs_raw_horovod"]), fmt(cell.get("horovod_vs_peer")),
                   rounds_label(cell.get("horovod_vs_peer_by_round")),
                   fmt(cell.get("vs_balance_off")), fmt(cell.get("vs_compile_off")),
                   fmt(cell.get("vs_zero_0")), fmt(cell.get("vs_wait_spin")), fmt(cell.get("vs_tensor_1")),
                   *memory_labels(cell), *tensor_memory_labels(cell), outside_label(cell)]


def rounds_label(ratios) -> str:
    """Each round's ratio, e.g. "1.01/0.97/1.00"; "-" for one round or none."""
    return "/".join(f"{r:.2f}" for r in ratios) if ratios and len(ratios) > 1 else "-"


def wait_setting(cell: dict) -> str:
    """horovod.wait of a torch hvdcls cell; "-" where it does not apply (the baselines,
    TensorFlow) or the report predates it (those torch cells spun)."""
    return cell.get("wait", "-") if cell["runner"] == "hvdcls" and cell["backend"] == "torch" else "-"


def memory_labels(cell: dict) -> list[str]:
    """Rank 0's bytes in MB (the baselines count none) and the sharded ones against np=1."""
    mine = cell.get("memory") or {}
    against = cell.get("memory_vs_np_1") or {}
    return ([fmt(megabytes(mine.get(name)), "{:.0f}" if name == "peak_rss_bytes" else "{:.3f}")
             for name in MEMORY]
            + [fmt(against.get(name), "{:.3f}") for name in SHARDED])


def tensor_memory_labels(cell: dict) -> list[str]:
    """Rank 0's activation memory of a step in MB, and its parameter and activation bytes
    against the T=1 cell's (hvdcls.bench.tensor)."""
    return [fmt(megabytes(cell.get("activation_bytes")), "{:.1f}"), fmt(cell.get("param_vs_tensor_1"), "{:.3f}"),
            fmt(cell.get("activation_vs_tensor_1"), "{:.3f}")]


def compression_label(cell: dict) -> str:
    """The compression; for a DDP cell its hook's bucket count where DDP was held to one bucket
    (its PowerSGD hook aborts or hangs on gloo with several in flight)."""
    settings = cell.get("runner_settings") or {}
    if cell["runner"] == "ddp" and settings.get("buckets") == 1 and cell["compression"] == "powersgd":
        return f"{cell['compression']} (1 bucket)"
    return cell["compression"]


def best_lines(rows: list[dict]) -> list[str]:
    """Each stack at its best: hvdcls's fastest compression against its peer's fastest."""
    if not rows:
        return []
    header = ["backend", "np", "batch", "model", "data", "hvdcls best", "img/s", "peer best", "img/s",
              "hvdcls / peer"]
    cells = [[r["backend"], str(r["np"]), str(r["batch_size"]), r["model"], r["data"],
              r["hvdcls_compression"], f"{r['hvdcls_images_per_sec']:.1f}",
              f"{r['peer']} {r['peer_compression']}", f"{r['peer_images_per_sec']:.1f}",
              f"{r['ratio']:.2f}"] for r in rows]
    return ["", "Each stack with its fastest compression (np>1; the peer is DDP with its own "
            "communication hooks for torch, MultiWorkerMirroredStrategy for TensorFlow):", "",
            *tables.markdown(header, cells)]


def balance_label(cell: dict) -> str:
    """off, or the mode and the plan it settled on (e.g. dynamic 43/21)."""
    balance, plan = cell.get("balance", "off"), cell.get("balance_plan")
    return balance if not plan else f"{balance} {'/'.join(map(str, plan))}"


def outside_label(cell: dict) -> str:
    """The CPU other processes used during the cell, as a share of the machine; `!` flags a
    cell measured while something else ran (hvdcls.bench.guard.BUSY_SHARE)."""
    share = cell.get("outside_cpu_share")
    return "-" if share is None else f"{share:.0%}" + (" !" if cell.get("busy") else "")


def data_label(cell: dict) -> str:
    """memory, or the format and its loader workers (e.g. lmdb/2w)."""
    data = cell.get("data", "memory")  # reports from before --data have memory cells only
    workers = cell.get("loader_workers")
    return data if data == "memory" or workers is None else f"{data}/{workers}w"


def allocators(report: dict) -> str:
    """'; hvdcls's ranks on tcmalloc' (hvdcls/launching/allocator.py); the peers' allocator is whatever
    their environment gives them."""
    found = sorted({c["allocator"] for c in report["cells"] if c.get("allocator")})
    return f"; hvdcls's ranks on {', '.join(found)} (HVDCLS_ALLOCATOR)" if found else ""


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# hvdcls bench on {m['hostname']}", "",
             f"{m['cpu']}, {m['usable_cores']} usable cores; Python {m['python']}; " +
             ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + allocators(report), "",
             f"image size {report['spec']['image_size']}, {report['spec']['warmup']} warm-up steps, "
             f"{report['spec'].get('rounds', 1)} round(s) x {report['spec']['reps']} x "
             f"{report['spec']['steps']} timed steps; fusion threshold "
             f"{report['spec']['fusion_threshold_mb']:g} MB, cycle time {report['spec']['cycle_time_ms']:g} ms; "
             + ("hvdcls's PowerSGD all-reduces P and Q in float16 (DDP's hook: float32); "
                if report["spec"].get("powersgd_fp16") else "") +
             ("activation checkpointing in every hvdcls cell; "
              if report["spec"].get("activation_checkpointing") else "") +
             "allreduce wait: share of the step spent waiting for gradients after backward "
             "(torch backend only); data: memory (one batch reused) or files read through the "
             "loader with N workers per rank; data wait: share of the step blocked waiting for "
             "the next batch; balance: training.balance and the per-rank batches it settled on; "
             "compile: training.compile (torch.compile / XLA); 1st step s: the first step, "
             "which compiles when it is on (untimed, as are the steps after it); zero: "
             "training.zero (1: optimizer state sharded, 2: gradients too, 3: parameters too), vs zero 0 its img/s "
             "over the zero 0 cell's; wait: horovod.wait (torch; sleep: the all-reduces polled "
             "with naps, spin: Horovod's synchronize(), auto: sleep over 16 MB of gradients), "
             "vs wait spin its img/s over the spin cell's; tensor: parallel.tensor (np/T replicas of T ranks, "
             "img/s counting each replica's batch once), TP share: the step's share spent in the "
             "activations' all-reduces within the tensor group, TP MB/step: their bytes a step (MB/step: "
             "the data-parallel gradients'), vs tensor 1: img/s over the T=1 cell's, act MB: what rank 0's "
             "forward keeps for backward in one step (torch: its saved-tensor hooks, TensorFlow: what the step's "
             "graph's backward reads from its forward; - where not counted), "
             "param/act vs T=1: over the T=1 cell's; param/grad/opt state MB: rank 0's tensors after the timed "
             "steps, counted from them, and its peak RSS; opt state/grad vs np=1: those bytes "
             "over the np=1 cell's at the same zero (0.50: halved per rank); Horovod/peer: "
             "against the framework's own data parallelism, DDP (torch; powersgd in one bucket) "
             "or MultiWorkerMirroredStrategy (TensorFlow, uncompressed only), by round: that "
             "ratio in each round, from the two cells' medians of the round"
             + slow_label(report["spec"]) + "; outside CPU: what processes other than the bench "
             "used while the cell ran (the worst round), as a share of the machine; `!`: over "
             f"{BUSY_SHARE:.0%}, so the cell's figures are not to be trusted.", "",
             *tables.markdown(COLUMNS, map(row, report["cells"]))]
    lines += best_lines(report.get("best_vs_peer") or [])
    return "\n".join(lines + sweep_lines(report.get("allreduce_sweep"))) + "\n"


def slow_label(spec: dict) -> str:
    compose = spec.get("compose")
    if compose:  # tools/bench_unequal.py: ranks in containers of unequal CPU
        cpus = ", ".join(f"{name} {cores:g}" for name, cores in compose["worker_cpus"].items())
        return (f" ({compose['ranks_per_worker']} ranks in each compose worker, CPU caps in "
                f"cores: {cpus})")
    slow = spec.get("slow_rank")
    if not slow:
        return ""
    rank, _, fraction = slow.partition("=")
    return f" (rank {rank} of every np>1 cell ran with {float(fraction):.0%} of the others' CPU)"


def sweep_lines(sweep) -> list[str]:
    if not sweep:
        return []
    if "error" in sweep:
        return ["", f"All-reduce sweep failed: {sweep['error']}"]
    lines = ["", f"All-reduce bus bandwidth across the shaped link ({sweep['link']}, "
             f"{sweep['world_size']} ranks), one message at a time:", "",
             *tables.markdown(["message MB", "median s", "bus Gbit/s", "share of link"],
                              ([f"{r['bytes'] / 1e6:.2f}", f"{r['seconds']:.4f}",
                                f"{r['bus_gbit_per_s']:.3f}", f"{r['share_of_link']:.0%}"]
                               for r in sweep["sweep"]))]
    return lines + gradient_lines(sweep["gradients"])


def gradient_lines(rows: list[dict]) -> list[str]:
    """One step's gradients under each fusion threshold x cycle time, fastest first."""
    good = sorted((r for r in rows if "error" not in r), key=lambda r: r["seconds"])
    if not good:
        return []
    first = good[0]
    header = ["fusion MB", "cycle ms", "median s", "bus Gbit/s", "share of link", "vs fastest"]
    cells = [[f"{r['fusion_mb']:g}", f"{r['cycle_ms']:g}", f"{r['seconds']:.4f}",
              f"{r['bus_gbit_per_s']:.3f}", f"{r['share_of_link']:.0%}",
              f"{first['seconds'] / r['seconds']:.2f}"] for r in good]
    cells += [[f"{r['fusion_mb']:g}", f"{r['cycle_ms']:g}", f"failed: {r['error'][:60]}", "", "", ""]
              for r in rows if "error" in r]
    return ["", f"One step's gradients of {first['model']} ({first['tensors']} tensors, "
            f"{first['bytes'] / 1e6:.1f} MB) by fusion threshold and cycle time, fastest first:", "",
            *tables.markdown(header, cells)]


def link_label(spec: dict) -> str:
    if not spec.get("link_mbit"):
        return ""
    from hvdcls.bench.netns import Link  # how the shaped link names itself, in the sweep's table too

    return ", np>1 across " + Link(spec["link_mbit"], spec.get("link_delay_ms") or 0.0).describe()


def plot(report: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    good = [c for c in report["cells"] if "error" not in c]
    labels = [f"{c['runner']}\n{c['backend'][:5]} np{c['np']} {c['compression']}\nb{c['batch_size']} "
              f"{c['model']}\n{data_label(c)}{wait_label(c)}\n{balance_label(c)}"
              f"{' compiled' if c.get('compile') == 'on' else ''}"
              f"{' zero ' + str(c['zero']) if c.get('zero') else ''}"
              f"{' T=' + str(c['tensor']) if c.get('tensor', 1) > 1 else ''}" for c in good]
    medians = [c["images_per_sec"]["median"] for c in good]
    errors = [[m - c["images_per_sec"]["min"] for m, c in zip(medians, good)],
              [c["images_per_sec"]["max"] - m for m, c in zip(medians, good)]]
    colours = {"hvdcls": "tab:blue", "raw-horovod": "tab:orange", "ddp": "tab:green", "mwms": "tab:red"}
    figure = Figure(figsize=(max(6.0, 0.9 * len(good) + 2), 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.bar(range(len(good)), medians, yerr=errors, capsize=3,
             color=[colours.get(c["runner"], "tab:gray") for c in good])
    axes.set_xticks(range(len(good)), labels, fontsize=7)
    axes.set_ylabel("images/s, all workers (median, min-max)")
    axes.set_title(f"hvdcls bench on {report['machine']['hostname']}" + link_label(report["spec"]))
    figure.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    figure.savefig(tmp, format="png")
    tmp.replace(path)


def wait_label(cell: dict) -> str:
    share = cell.get("data_wait_share")
    return "" if share is None else f" wait {share:.0%}"


def write_outputs(report: dict, output_dir: Path) -> None:
    fileio.write_atomic(output_dir / "bench.md", markdown(report).encode())
    plot(report, output_dir / "bench.png")
