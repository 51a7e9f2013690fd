"""`python -m hvdcls.serve.wrapper RUN_DIR -- horovodrun ...`: run the job, record how it ended.

The service starts this as the leader of the job's process group. It outlives a restart of the
service, so the exit status cannot be left to the service's wait(): it is written into
RUN_DIR/exit_status.json. SIGTERM to the group reaches horovodrun, which stops its ranks; the
wrapper only notes it and keeps waiting, so the status is still written.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from hvdcls.fileio import write_json_atomic
from hvdcls.serve.runner import EXIT


def main(argv: list[str]) -> int:
    run_dir, separator, command = Path(argv[0]), argv[1], argv[2:]
    assert separator == "--" and command, "usage: wrapper RUN_DIR -- COMMAND ..."
    terminated: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(time.time()))
    started = time.time()
    returncode = subprocess.Popen(command).wait()
    write_json_atomic(run_dir / EXIT, {"returncode": returncode, "terminated": bool(terminated),
                                       "seconds": round(time.time() - started, 3)})
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
