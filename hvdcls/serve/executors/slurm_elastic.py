"""Elastic jobs under `--executor slurm`: sized within their allocation, shrinking on a lost node.

Slurm fixes a job's nodes when it starts; it can take nodes away but never adds any (the table
in docs/serve.md). So an elastic job asks Slurm for max_np tasks with `--no-kill` (a node that
fails does not end the job), and its batch script runs `horovodrun --min-np --max-np
--host-discovery-script RUN_DIR/discover.sh`. That script, written inside the allocation,
prints the allocation's nodes that are still usable:

    RUN_DIR/slurm_nodes   the allocation as it started (HOST:SLOTS lines; never changes)
    RUN_DIR/discover.sh   those of them Slurm does not mark down, drained, failing or not
                          responding AND whose sshd accepts a connection within REACH_SECONDS
    RUN_DIR/allocation    what discover.sh printed last (the service shows it as the hosts)

Slurm alone would notice a dead node only after SlurmdTimeout (300 s by default), Horovod's
discovery runs every second: the sshd check is what drops a lost node within seconds. Horovod
then resets the job on the nodes left (down to min_np); below min_np for its elastic timeout,
horovodrun fails and so does the job. A node that comes back while the job runs is used again
(Horovod's blacklist cooldown), but a node the job never had cannot be added.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

from hvdcls.files.fileio import write_atomic
from hvdcls.launching import launch
from hvdcls.serve import runner

NODES = "slurm_nodes"
REACH_SECONDS = 5  # a spawn on a loaded node can be slow; a dead one fails at once (no name, no route)
UNUSABLE_STATES = "down,drain,fail,no_respond"

# Horovod runs this every second and fails the job if it exits non-zero: it always exits 0.
DISCOVERY_SCRIPT = r"""#!/bin/bash
# Written by hvdcls serve (hvdcls/serve/executors/slurm_elastic.py): Horovod's host discovery for one
# elastic job under Slurm. Prints the allocation's nodes ($nodes) that Slurm does not mark
# unusable and whose sshd (the port ssh uses for the node) answers within @REACH@ s.
nodes=@NODES@
allocation=@ALLOCATION@
unusable=" $(sinfo --noheader --Node --states=@STATES@ --format=%N 2>/dev/null | tr '\n' ' ') "
# Twice: a node is dropped only if neither try connects (a dead one fails both at once; a live
# one on a loaded machine may lose the first try to a slow start of bash).
reach() { timeout @REACH@ bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; }
live=""
while IFS=: read -r host slots; do
    [ -n "$host" ] || continue
    case "$unusable" in *" $host "*) continue ;; esac
    port=$(ssh -G "$host" 2>/dev/null | awk '$1 == "port" {print $2}')
    reach "$host" "${port:-22}" || reach "$host" "${port:-22}" || continue
    live+="$host:$slots"$'\n'
done < "$nodes"
printf '%s' "$live"
if [ "$(printf '%s' "$live")" != "$(cat "$allocation" 2>/dev/null)" ]; then
    printf '%s' "$live" > "$allocation.$$" && mv -f "$allocation.$$" "$allocation" || true
fi
exit 0
"""


def discovery_script(run_dir: Path) -> str:
    words = {"@NODES@": shlex.quote(str(run_dir / NODES)),
             "@ALLOCATION@": shlex.quote(str(run_dir / runner.ALLOCATION)),
             "@STATES@": UNUSABLE_STATES, "@REACH@": str(REACH_SECONDS)}
    text = DISCOVERY_SCRIPT
    for word, value in words.items():
        text = text.replace(word, value)
    return text


def write_discovery(run_dir: Path, hosts: dict[str, int]) -> None:
    """Inside the allocation, before horovodrun starts: the nodes it began with and the script."""
    write_atomic(run_dir / NODES, "".join(f"{h}:{n}\n" for h, n in hosts.items()).encode())
    write_atomic(run_dir / runner.DISCOVERY, discovery_script(run_dir).encode())
    (run_dir / runner.DISCOVERY).chmod(0o755)


def horovodrun(np: int, min_np: int, max_np: int, run_dir: Path, train: list[str],
               network_interface: Optional[str] = None) -> list[str]:
    return launch.horovodrun_elastic(np, min_np, max_np, str(run_dir / runner.DISCOVERY), train,
                                     network_interface=network_interface)


# What discover.sh printed last ({} when no node was usable); None before the job started.
current_hosts = runner.read_allocation


def below_min_np(hosts: Optional[dict[str, int]], min_np: Optional[int]) -> Optional[str]:
    """Why an elastic job failed, when its nodes left it fewer than min_np slots."""
    if hosts is None or min_np is None or sum(hosts.values()) >= min_np:
        return None
    left = launch.hosts_arg(hosts) or "no node"
    return f"{sum(hosts.values())} slot(s) left ({left}), fewer than min_np={min_np}"
