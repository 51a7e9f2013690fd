"""hvdcls.serve.users on a real job table: tokens kept only as hashes, the first admin made from
STATE_DIR/token (also in a table from before users, whose jobs become admin's), the rules of
add and revoke. (Every request needing a token, against a real server: tests/parallel/test_serve_api.py.)"""
import hashlib
import sqlite3

import pytest

from hvdcls.errors import UserError
from hvdcls.serve import users
from hvdcls.serve.store import Store

SPEC = {"np": 1, "backend": "torch", "name": None, "requeue": False, "elastic": False, "min_np": None,
        "max_np": None}


def test_a_table_from_before_users_opens_and_its_jobs_become_the_first_admins(tmp_path):
    old = Store(tmp_path / "jobs.db")
    old.add(SPEC, epochs=3)
    old.engine.dispose()
    with sqlite3.connect(tmp_path / "jobs.db") as db:  # as an older hvdcls left it
        db.execute("DROP TABLE users")
        db.execute("DROP INDEX ix_jobs_owner_idempotency_key")
        for column in ("owner", "idempotency_key", "launch_id"):
            db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    (tmp_path / "token").write_text("the-old-shared-token\n")
    store = Store(tmp_path / "jobs.db")
    users.ensure_first_admin(store, tmp_path)
    admin = users.authenticate(store, "the-old-shared-token")
    assert (admin.name, admin.admin) == ("admin", True)
    assert store.get(1).owner == "admin" and store.add(SPEC, 3, owner="alice").owner == "alice"
    users.ensure_first_admin(store, tmp_path)  # a second start changes nothing
    assert [u.name for u in store.users()] == ["admin"]


def test_a_new_state_directory_gets_a_token_file_readable_by_its_owner_only(tmp_path):
    store = Store(tmp_path / "jobs.db")
    users.ensure_first_admin(store, tmp_path)
    token = (tmp_path / "token").read_text().strip()
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600 and len(token) >= 40
    assert users.authenticate(store, token).name == "admin"
    assert users.authenticate(store, token[:-1]) is None and users.authenticate(store, None) is None


def test_tokens_are_kept_only_as_their_sha256(tmp_path):
    store = Store(tmp_path / "jobs.db")
    users.ensure_first_admin(store, tmp_path)
    token = users.add(store, "alice", admin=False)
    assert store.user("alice").token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    assert token.encode() not in (tmp_path / "jobs.db").read_bytes() + (tmp_path / "jobs.db-wal").read_bytes()
    assert users.authenticate(store, token).name == "alice" and users.add(store, "bob", False) != token


def test_add_and_revoke_refuse_what_would_break_things(tmp_path):
    store = Store(tmp_path / "jobs.db")
    users.ensure_first_admin(store, tmp_path)
    alice = users.add(store, "alice", admin=False)
    for name, words in (("alice", "alice has a token already"), ("a b", "letters, digits"),
                        ("-x", "letters, digits"), ("x" * 65, "64 at most")):
        with pytest.raises(UserError, match=words):
            users.add(store, name, admin=False)
    with pytest.raises(UserError, match="admin is the last admin"):
        users.revoke(store, "admin")
    with pytest.raises(UserError, match="no user 'zed'"):
        users.revoke(store, "zed")
    users.revoke(store, "alice")
    assert users.authenticate(store, alice) is None
    users.add(store, "carol", admin=True)
    users.revoke(store, "admin")  # another admin is left
    assert [u.name for u in store.users()] == ["carol"]


def test_only_the_owner_or_an_admin_may_cancel(tmp_path):
    store = Store(tmp_path / "jobs.db")
    users.ensure_first_admin(store, tmp_path)
    users.add(store, "alice", admin=False)
    alice, admin = store.user("alice"), store.user("admin")
    assert users.may_cancel(alice, "alice") and not users.may_cancel(alice, "bob")
    assert not users.may_cancel(alice, None) and users.may_cancel(admin, "bob") and users.may_cancel(admin, None)


def test_a_token_never_reads_as_an_option():
    tokens = [users.new_token() for _ in range(500)]  # a bare token_urlsafe starts with "-" 1 in 64
    assert all(t.startswith(users.TOKEN_PREFIX) and len(t) > 40 for t in tokens) and len(set(tokens)) == 500
