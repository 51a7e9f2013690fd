"""`python -m hvdcls.serve.wrapper RUN_DIR [--launch ID] -- horovodrun ...`: run the job, record
how it ended.

The service starts this as the leader of the job's process group. It outlives a restart of the
service, so the exit status cannot be left to the service's wait(): it is written into
RUN_DIR/exit_status.json. SIGTERM to the group reaches horovodrun, which stops its ranks; the
wrapper only notes it and keeps waiting, so the status is still written.

With `--launch ID` (the service's launch record, hvdcls.serve.launches) its first act is to
claim the launch, writing its pid and start time: a service restarted after a crash finds the
job by that, even before the service itself recorded the pid. A launch the restarted service
abandoned first is not run at all (exit status 0, no record: it is not this launch's job now).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from hvdcls.files.fileio import write_json_atomic
from hvdcls.serve import launches
from hvdcls.serve.runner import EXIT


def parse(argv: list[str]) -> tuple[Path, Optional[str], list[str]]:
    """RUN_DIR, the launch id (None without --launch) and the command after `--`."""
    usage = "usage: wrapper RUN_DIR [--launch ID] -- COMMAND ..."
    assert len(argv) >= 3 and "--" in argv, usage
    split = argv.index("--")
    head, command = argv[:split], argv[split + 1:]
    assert command and len(head) in (1, 3) and head[1:2] in ([], ["--launch"]), usage
    return Path(head[0]), (head[2] if len(head) == 3 else None), command


def main(argv: list[str]) -> int:
    run_dir, launch_id, command = parse(argv)
    terminated: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(time.time()))
    if launch_id is not None and not launches.claim_for_wrapper(run_dir, launch_id):
        print(f"hvdcls: launch {launch_id} was abandoned by a restarted service; not running it",
              file=sys.stderr, flush=True)
        return 0
    started = time.time()
    # A cancel that came before the command did would never reach it: it is not started then.
    returncode = -signal.SIGTERM if terminated else subprocess.Popen(command).wait()
    write_json_atomic(run_dir / EXIT, {"returncode": returncode, "terminated": bool(terminated),
                                       "seconds": round(time.time() - started, 3), "launch": launch_id})
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
