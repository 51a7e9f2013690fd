"""`hvdcls serve`: a training service on a fixed host inventory, or over Slurm (docs/serve.md).

    spec.py       what a job may ask for (pydantic), checked with `hvdcls train`'s own validation
    scheduler.py  gang FIFO with backfill that cannot delay the head (pure logic)
    elasticity.py shrink elastic jobs to admit the head, grow them when nothing waits (pure)
    store.py      the job table over SQLite (WAL): the queue, surviving restarts
    runner.py     one job's run directory, the same under every executor
    wrapper.py    the job's process group leader: claims its launch first, records its exit status
    launches.py   a launch's claim in the run directory: what a restart after a crash decides from
    faults.py     test-only hooks: a crash at a chosen point, a stand-in for horovodrun
    settings.py   how the service was started (Settings)
    slurm_options.py  SlurmOptions, declared once: the spec's field, the defaults, the flags, #SBATCH lines
    errors.py     what the service refuses: Refused, TooLarge, Rejected, Unsupported (HTTP 400)
    service.py    the loop: adopt after a restart, follow, cancel, hang, resize, schedule, start
    executors/    what runs the jobs, behind one contract (base.py): the host list (hosts.py) or
                  Slurm (slurm.py and its slurm_*.py), chosen by name (--executor)
    metrics.py    the service's /metrics (Prometheus), read from the job table and status files
    app.py        the HTTP API (FastAPI); server start-up (uvicorn)
    users.py      one token per user, stored hashed; the first admin; `hvdcls serve token ...`
    guards.py     a bound on request bodies, the state directory's reserve, disk full as HTTP 507
    commands.py   the subcommands' arguments (argparse only)
    client.py     the CLI side (httpx): submit, jobs, status, logs, cancel

Framework-free, like the rest of the core; FastAPI, uvicorn, SQLAlchemy, pydantic and httpx
are the optional `hvdcls[serve]` extra, imported only when a serve command runs.
"""
