"""The job table: the queue itself, in SQLite (WAL), so that a restart loses nothing.

Job ids grow with submission, so "queued, ordered by id" is the queue. Every change is one short
transaction; SQLite serialises the writers (the API's threads and the service loop) and WAL lets
readers go on meanwhile.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from sqlalchemy import Boolean, Float, Integer, String, Text, create_engine, event, func, inspect, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
FINAL = (SUCCEEDED, FAILED, CANCELLED)


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[Optional[str]] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(16), index=True, default=QUEUED)
    backend: Mapped[str] = mapped_column(String(32))
    np: Mapped[int] = mapped_column(Integer)
    epochs: Mapped[int] = mapped_column(Integer)  # from its validated config: progress
    elastic: Mapped[bool] = mapped_column(Boolean, default=False)
    min_np: Mapped[Optional[int]] = mapped_column(Integer)
    max_np: Mapped[Optional[int]] = mapped_column(Integer)
    resized_at: Mapped[Optional[float]] = mapped_column(Float)  # its start or last resize
    resizes: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[str] = mapped_column(Text)  # the JobSpec as submitted (JSON)
    requeue: Mapped[bool] = mapped_column(Boolean, default=False)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[Optional[float]] = mapped_column(Float)
    first_step_at: Mapped[Optional[float]] = mapped_column(Float)
    ended_at: Mapped[Optional[float]] = mapped_column(Float)
    hosts: Mapped[Optional[str]] = mapped_column(Text)  # its allocation (JSON host -> slots)
    run_dir: Mapped[Optional[str]] = mapped_column(Text)
    pid: Mapped[Optional[int]] = mapped_column(Integer)  # the job's process group leader
    pid_start: Mapped[Optional[int]] = mapped_column(Integer)  # its start time (pid reuse guard)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    stop_requested_at: Mapped[Optional[float]] = mapped_column(Float)  # cancel, or found hung
    stop_reason: Mapped[Optional[str]] = mapped_column(Text)  # None: cancelled; else why it failed
    exit_status: Mapped[Optional[int]] = mapped_column(Integer)
    message: Mapped[Optional[str]] = mapped_column(Text)  # why it failed: reason + last log lines
    external_id: Mapped[Optional[str]] = mapped_column(String(64))  # its Slurm job id (--executor slurm)

    def as_dict(self) -> dict[str, Any]:
        out = {c.name: getattr(self, c.name) for c in self.__table__.columns}
        out["spec"] = json.loads(self.spec)
        out["hosts"] = json.loads(self.hosts) if self.hosts else None
        return out


class Store:
    def __init__(self, path: Path):
        self.engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 30,
                                                                       "check_same_thread": False})
        event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        add_new_columns(self.engine)
        self.session = sessionmaker(self.engine, expire_on_commit=False)

    def add(self, spec: dict, epochs: int) -> Job:
        """A new queued job from a validated spec (JobSpec.model_dump())."""
        with self.session.begin() as session:
            job = Job(spec=json.dumps(spec, sort_keys=True), np=spec["np"], backend=spec["backend"],
                      name=spec["name"], requeue=spec["requeue"], elastic=spec["elastic"],
                      min_np=spec["min_np"], max_np=spec["max_np"], resizes=0, epochs=epochs,
                      state=QUEUED, submitted_at=time.time(), attempts=0)
            session.add(job)
        return job

    def delete(self, job_id: int) -> None:
        """Forget a job that never was (its executor refused it at submit)."""
        with self.session.begin() as session:
            job = session.get(Job, job_id)
            if job is not None:
                session.delete(job)

    def get(self, job_id: int) -> Optional[Job]:
        with self.session() as session:
            return session.get(Job, job_id)

    def list(self, states: tuple[str, ...] = STATES) -> list[Job]:
        with self.session() as session:
            return list(session.scalars(select(Job).where(Job.state.in_(states)).order_by(Job.id)))

    def update(self, job_id: int, expect: Optional[tuple[str, ...]] = None, **fields) -> Optional[Job]:
        """Set `fields` on the job if its state is one of `expect` (any when None); the job
        after the change, or None when it was not in an expected state."""
        with self.session.begin() as session:
            job = session.get(Job, job_id)
            if job is None or (expect is not None and job.state not in expect):
                return None
            for key, value in fields.items():
                setattr(job, key, value)
        return job

    def counts(self) -> dict[str, int]:
        with self.session() as session:
            rows = session.execute(select(Job.state, func.count()).group_by(Job.state))
            return {**dict.fromkeys(STATES, 0), **dict(rows.tuples().all())}

    def total_resizes(self) -> int:
        with self.session() as session:
            return session.scalar(select(func.coalesce(func.sum(Job.resizes), 0)))

    def times(self) -> list:
        """(submitted_at, started_at, first_step_at) rows of every job, for /metrics."""
        with self.session() as session:
            return list(session.execute(select(Job.submitted_at, Job.started_at, Job.first_step_at)))


def add_new_columns(engine) -> None:
    """A table made by an older hvdcls lacks the columns added since (all nullable): add them."""
    present = {column["name"] for column in inspect(engine).get_columns(Job.__tablename__)}
    with engine.begin() as connection:
        for column in Job.__table__.columns:
            if column.name not in present:
                kind = column.type.compile(engine.dialect)
                connection.execute(text(f"ALTER TABLE {Job.__tablename__} ADD COLUMN {column.name} {kind}"))


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
