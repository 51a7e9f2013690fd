"""The job table: the queue itself, in SQLite (WAL), so that a restart loses nothing; the users
table: who may call the API (hvdcls.serve.users), each by a hash of their token; and the
console's sessions, each by a hash of its id, so that a restart signs no one out.

Job ids grow with submission, so "queued, ordered by id" is the queue. Every change is one short
transaction; SQLite serialises the writers (the API's threads and the service loop) and WAL lets
readers go on meanwhile.
"""
from __future__ import annotations

import builtins
import json
import time
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, cast, get_args

from sqlalchemy import (
    Boolean,
    CursorResult,
    Float,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    delete,
    event,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
State = Literal["queued", "running", "succeeded", "failed", "cancelled"]  # the API's ?state= choices
STATES: tuple[str, ...] = get_args(State)
FINAL = (SUCCEEDED, FAILED, CANCELLED)
PRUNED = "pruned"  # a cancel's reason: the job's sweep stopped it (POST /jobs/{id}/cancel?reason=pruned)


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
    owner: Mapped[Optional[str]] = mapped_column(String(64))  # the user who submitted it (users.name)
    sweep_id: Mapped[Optional[str]] = mapped_column(String(100), index=True)  # its spec's sweep.id: a trial
    cancel_reason: Mapped[Optional[str]] = mapped_column(String(16))  # None: a person's; PRUNED: its sweep's
    launch_id: Mapped[Optional[str]] = mapped_column(String(32))  # its launch, committed before the start
    idempotency_key: Mapped[Optional[str]] = mapped_column(String(255))  # its submission's, per owner

    # A retried submission finds the job its key made (NULLs are distinct: keyless ones never clash).
    __table_args__ = (Index("ix_jobs_owner_idempotency_key", "owner", "idempotency_key", unique=True),)

    def as_dict(self) -> dict[str, Any]:
        out = {c.name: getattr(self, c.name) for c in self.__table__.columns}
        out["spec"] = json.loads(self.spec)
        out["hosts"] = json.loads(self.hosts) if self.hosts else None
        out["sweep"] = out["spec"].get("sweep")  # the trial it is, if any (hvdcls sweep)
        return out


class User(Base):
    """One token per user; only its SHA-256 is kept (hvdcls.serve.users says why that is enough)."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)


class ConsoleSession(Base):
    """A console sign-in (hvdcls.serve.console.session): kept by the SHA-256 of its cookie's
    random id, so a copied database opens no session; it belongs to the user whose token it was
    made with, by that token's hash."""

    __tablename__ = "console_sessions"

    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float, index=True)


class Store:
    def __init__(self, path: Path):
        self.engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 30,
                                                                       "check_same_thread": False})
        event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)
        add_new_columns(self.engine)
        self.session = sessionmaker(self.engine, expire_on_commit=False)

    def add(self, spec: dict, epochs: int, owner: Optional[str] = None, **fields) -> Job:
        """A new queued job from a validated spec (JobSpec.model_dump()); `fields`: more columns
        (launch_id, idempotency_key). IntegrityError when the owner's key made a job already."""
        with self.session.begin() as session:
            job = Job(spec=json.dumps(spec, sort_keys=True), np=spec["np"], backend=spec["backend"],
                      name=spec["name"], requeue=spec["requeue"], elastic=spec["elastic"],
                      min_np=spec["min_np"], max_np=spec["max_np"], resizes=0, epochs=epochs,
                      state=QUEUED, submitted_at=time.time(), attempts=0, owner=owner,
                      sweep_id=(spec.get("sweep") or {}).get("id"), **fields)
            session.add(job)
        return job

    def by_key(self, owner: Optional[str], key: str) -> Optional[Job]:
        """The job `owner` submitted with this idempotency key, if any."""
        query = select(Job).where(Job.owner == owner if owner is not None else Job.owner.is_(None),
                                  Job.idempotency_key == key)
        with self.session() as session:
            return session.scalar(query)

    def delete(self, job_id: int) -> None:
        """Forget a job that never was (its executor refused it at submit)."""
        with self.session.begin() as session:
            job = session.get(Job, job_id)
            if job is not None:
                session.delete(job)

    def get(self, job_id: int) -> Optional[Job]:
        with self.session() as session:
            return session.get(Job, job_id)

    def list(self, states: tuple[str, ...] = STATES, limit: Optional[int] = None, offset: int = 0,
             newest_first: bool = False) -> list[Job]:
        """Jobs in `states` in submission order (or the reverse); a page of them with `limit`."""
        order = Job.id.desc() if newest_first else Job.id
        query = select(Job).where(Job.state.in_(states)).order_by(order).offset(offset).limit(limit)
        with self.session() as session:
            return list(session.scalars(query))

    def count(self, states: tuple[str, ...] = STATES) -> int:
        with self.session() as session:
            return session.scalar(select(func.count()).select_from(Job).where(Job.state.in_(states))) or 0

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
            return int(session.scalar(select(func.coalesce(func.sum(Job.resizes), 0))) or 0)

    def times(self) -> builtins.list:  # (`list` here is the method above)
        """(submitted_at, started_at, first_step_at) rows of every job, for /metrics."""
        with self.session() as session:
            return list(session.execute(select(Job.submitted_at, Job.started_at, Job.first_step_at)))

    # --- sweeps: jobs tagged with a sweep id (JobSpec.sweep) -----------------------------------

    def sweep_owner(self, sweep_id: str) -> Optional[str]:
        """Whose jobs carry this sweep id (the first's owner); None when none does."""
        with self.session() as session:
            return session.scalar(select(Job.owner).where(Job.sweep_id == sweep_id).order_by(Job.id).limit(1))

    def sweep_ids(self, limit: Optional[int] = None, offset: int = 0) -> builtins.list[str]:
        """The sweeps, the one with the newest job first; a page of them with `limit`."""
        query = (select(Job.sweep_id).where(Job.sweep_id.is_not(None)).group_by(Job.sweep_id)
                 .order_by(func.max(Job.id).desc()).offset(offset).limit(limit))
        with self.session() as session:
            return [str(found) for found in session.scalars(query)]

    def count_sweeps(self) -> int:
        with self.session() as session:
            return session.scalar(select(func.count(func.distinct(Job.sweep_id)))) or 0

    def sweep_jobs(self, sweep_ids: Sequence[str]) -> builtins.list[Job]:
        """The jobs of these sweeps, in submission order."""
        with self.session() as session:
            return list(session.scalars(select(Job).where(Job.sweep_id.in_(sweep_ids)).order_by(Job.id)))

    # --- users (hvdcls.serve.users) ---------------------------------------------------------

    def add_user(self, name: str, token_sha256: str, admin: bool) -> User:
        with self.session.begin() as session:
            user = User(name=name, token_sha256=token_sha256, admin=admin, created_at=time.time())
            session.add(user)
        return user

    def user(self, name: str) -> Optional[User]:
        with self.session() as session:
            return session.get(User, name)

    def user_by_token(self, token_sha256: str) -> Optional[User]:
        with self.session() as session:
            return session.scalar(select(User).where(User.token_sha256 == token_sha256))

    def users(self) -> Sequence[User]:
        with self.session() as session:
            return list(session.scalars(select(User).order_by(User.created_at, User.name)))

    def remove_user(self, name: str) -> None:
        """The user, and every console session made with their token."""
        with self.session.begin() as session:
            user = session.get(User, name)
            if user is not None:
                session.execute(delete(ConsoleSession).where(ConsoleSession.token_sha256 == user.token_sha256))
                session.delete(user)

    # --- console sessions (hvdcls.serve.console.session) ------------------------------------

    def add_console_session(self, id_sha256: str, token_sha256: str, now: float, keep: int) -> None:
        """A new session; beyond `keep` sessions the least recently seen go."""
        with self.session.begin() as session:
            session.add(ConsoleSession(id_sha256=id_sha256, token_sha256=token_sha256, created_at=now, last_seen=now))
            session.flush()
            newest = select(ConsoleSession.id_sha256).order_by(ConsoleSession.last_seen.desc()).limit(keep)
            session.execute(delete(ConsoleSession).where(ConsoleSession.id_sha256.not_in(newest)))

    def console_session(self, id_sha256: str) -> Optional[ConsoleSession]:
        with self.session() as session:
            return session.get(ConsoleSession, id_sha256)

    def touch_console_session(self, id_sha256: str, now: float) -> None:
        with self.session.begin() as session:
            session.execute(update(ConsoleSession).where(ConsoleSession.id_sha256 == id_sha256).values(last_seen=now))

    def remove_console_sessions(self, id_sha256: Optional[str] = None, seen_before: Optional[float] = None) -> None:
        """One session (by its id's hash), and every session not seen since `seen_before`."""
        with self.session.begin() as session:
            if id_sha256 is not None:
                session.execute(delete(ConsoleSession).where(ConsoleSession.id_sha256 == id_sha256))
            if seen_before is not None:
                session.execute(delete(ConsoleSession).where(ConsoleSession.last_seen < seen_before))

    def claim_unowned(self, owner: str) -> int:
        """Jobs from before there were users (no owner) become `owner`'s; how many."""
        with self.session.begin() as session:
            result = session.execute(update(Job).where(Job.owner.is_(None)).values(owner=owner))
            return cast(CursorResult, result).rowcount


def add_new_columns(engine) -> None:
    """A table made by an older hvdcls lacks the columns added since (all nullable): add them."""
    present = {column["name"] for column in inspect(engine).get_columns(Job.__tablename__)}
    with engine.begin() as connection:
        for column in Job.__table__.columns:
            if column.name not in present:
                kind = column.type.compile(engine.dialect)
                connection.execute(text(f"ALTER TABLE {Job.__tablename__} ADD COLUMN {column.name} {kind}"))
        for index in Base.metadata.tables[Job.__tablename__].indexes:  # create_all made a new table's only
            index.create(connection, checkfirst=True)


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
