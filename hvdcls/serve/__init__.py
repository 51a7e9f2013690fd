"""`hvdcls serve`: a training service on a fixed host inventory, or over Slurm (docs/serve.md).

    spec.py       what a job may ask for (pydantic), checked with `hvdcls train`'s own validation
    scheduler.py  gang FIFO with backfill that cannot delay the head (pure logic)
    elasticity.py shrink elastic jobs to admit the head, grow them when nothing waits (pure)
    store.py      the job table over SQLite (WAL): the queue, surviving restarts
    runner.py     one run directory and one process group per job: `horovodrun ... hvdcls train`
    wrapper.py    the job's process group leader: records its exit status in the run directory
    service.py    the loop: reconcile after a restart, reap, cancel, schedule, launch (host list)
    slurm.py      --executor slurm: the batch script, SLURM_TASKS_PER_NODE, sbatch/squeue/scancel
    slurm_service.py  the executor handing each job to Slurm and following its state
    app.py        the HTTP API (FastAPI) and /metrics; server start-up (uvicorn)
    users.py      one token per user, stored hashed; the first admin; `hvdcls serve token ...`
    guards.py     a bound on request bodies, the state directory's reserve, disk full as HTTP 507
    commands.py   the subcommands' arguments (argparse only)
    client.py     the CLI side (httpx): submit, jobs, status, logs, cancel

Framework-free, like the rest of the core; FastAPI, uvicorn, SQLAlchemy, pydantic and httpx
are the optional `hvdcls[serve]` extra, imported only when a serve command runs.
"""
