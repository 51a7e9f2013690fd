"""The frameworks' own data parallelism, beside hvdcls in the bench: what a user would pick instead.

    torch       -> ddp:  DistributedDataParallel on gloo (nccl on GPU), launched by torchrun
    tensorflow  -> mwms: tf.distribute.MultiWorkerMirroredStrategy, one worker per rank, each
                         given its TF_CONFIG by benchmarks/mwms_tf.py's own launcher

On one machine both launch locally. Across a shaped link (--link-mbit) DDP runs one torchrun node
per namespace host, node 0's address as the rendezvous and gloo bound to the link's interface,
so its gradients cross the same shaped veth pair as the Horovod cells' (hvdcls.bench.netns).
MWMS is measured on one machine only.
"""
from __future__ import annotations

import itertools
from typing import Optional

from hvdcls.launching import launch

PEERS = {"torch": "ddp", "tensorflow": "mwms"}
ACROSS_LINK = {"ddp"}  # the peers the bench runs across --link-mbit's namespaces
# MultiWorkerMirroredStrategy's CommunicationOptions compress nothing.
UNSUPPORTED = {("mwms", "fp16"), ("mwms", "powersgd")}
# torchrun's rendezvous port inside the first namespace (nothing else listens there); a new one
# per launch, so a port the last cell's store left in TIME_WAIT is never reused.
_RENDEZVOUS_PORTS = itertools.count(29400)


def peer(backend: str) -> Optional[str]:
    return PEERS.get(backend)


def command(runner: str, np: int, program: list[str], hosts=None) -> list[str]:
    """The launch of a peer cell; `program` is [python, script, flags...]; `hosts`: the shaped
    link's ShapedHosts for an np>1 cell, else None (this machine)."""
    if runner == "mwms":
        return [*program, "--workers", str(np)]
    torchrun = launch.venv_tool("torchrun")
    if hosts is None or np == 1:
        return [torchrun, "--standalone", f"--nproc_per_node={np}", *program[1:]]
    from hvdcls.bench.netns import INTERFACE

    port = next(_RENDEZVOUS_PORTS)
    nodes = [["env", f"GLOO_SOCKET_IFNAME={INTERFACE}", torchrun, f"--nnodes={np}",
              "--nproc-per-node=1", f"--node-rank={rank}", f"--master-addr={hosts.addresses[0]}",
              f"--master-port={port}", *program[1:]] for rank in range(np)]
    return hosts.on_each(nodes)


def best_against_peers(results: list[dict]) -> list[dict]:
    """For each np>1 setting (backend, np, batch, model, data) measured both ways: hvdcls's
    fastest compression against its peer's fastest (DDP's best hook), and the ratio. The
    question on a slow link is not whether fp16 beats none but which stack is faster when each
    uses its best."""
    best: dict[tuple, dict[str, dict]] = {}
    for r in results:
        plain = (r.get("balance", "off") == "off" and r.get("compile", "off") == "off"
                 and r.get("zero", 0) == 0 and r.get("wait", "auto") == "auto")
        if "error" in r or r["np"] < 2 or not plain or r["runner"] not in ("hvdcls", peer(r["backend"])):
            continue
        setting = (r["backend"], r["np"], r["batch_size"], r["model"], r.get("data", "memory"))
        side = "hvdcls" if r["runner"] == "hvdcls" else "peer"
        kept = best.setdefault(setting, {}).get(side)
        if kept is None or r["images_per_sec"]["median"] > kept["images_per_sec"]["median"]:
            best[setting][side] = r
    out = []
    for (backend, np, batch, model, data), sides in best.items():
        if len(sides) == 2:
            mine, theirs = sides["hvdcls"], sides["peer"]
            out.append({"backend": backend, "np": np, "batch_size": batch, "model": model, "data": data,
                        "peer": peer(backend), "hvdcls_compression": mine["compression"],
                        "hvdcls_images_per_sec": mine["images_per_sec"]["median"],
                        "peer_compression": theirs["compression"],
                        "peer_images_per_sec": theirs["images_per_sec"]["median"],
                        "ratio": mine["images_per_sec"]["median"] / theirs["images_per_sec"]["median"]})
    return out
