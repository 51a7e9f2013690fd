"""Each thread of the running `hvdcls train` ranks over a window: python threads.py DELAY WINDOW.
Prints, per thread, its user and system CPU and the time it was runnable but waiting for a core
(/proc/PID/task/TID/schedstat), each as a share of the window."""
import os
import sys
import time
from pathlib import Path


def thread_times() -> dict:
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "hvdcls train" not in cmd or "horovodrun" in cmd:
            continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                waited = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(pid, tid, comm)] = (int(fields[11]), int(fields[12]), waited)
    return out


delay, window = float(sys.argv[1]), float(sys.argv[2])
time.sleep(delay)
before = thread_times()
time.sleep(window)
after = thread_times()
hz = os.sysconf("SC_CLK_TCK")
rows = []
for key, now in after.items():
    if key in before:
        user, system, waited = (now[i] - before[key][i] for i in range(3))
        rows.append((key, user / hz / window, system / hz / window, waited / 1e9 / window))
for (pid, _, comm), user, system, waited in sorted(rows, key=lambda r: -(r[1] + r[2])):
    if user + system + waited > 0:
        print(f"{pid:>7} {comm:<16} user {user:5.2f} sys {system:5.2f} runq-wait {waited:5.2f} (share of window)")
