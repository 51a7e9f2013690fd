"""Who may call the API: one bearer token per user, kept only as its SHA-256 in the job table's
database (the `users` table), and the `hvdcls serve token` commands that manage them, run on
the service's machine against its state directory (the service need not be stopped):

    hvdcls serve token add alice [--admin]   prints alice's new token: shown once, kept hashed
    hvdcls serve token list                  the users, admin or not, since when
    hvdcls serve token revoke alice          her token stops working at the next request

Why a plain SHA-256 and no salt or slow key derivation: a token is 32 random bytes
(secrets.token_urlsafe), not something a person chose. Salts and slow functions (scrypt,
PBKDF2) protect low-entropy passwords from dictionaries and precomputed tables; against 256
random bits a preimage search is hopeless however fast the hash, while a slow function would
cost each request (every one is authenticated) tens of milliseconds of CPU. Hashing without a
salt also lets a request find its user by an index lookup of the hash instead of trying every
row; an attacker cannot choose the hash being looked up, so the lookup's timing tells nothing.
What the hash protects against is a leaked database: it holds no usable token.

The first admin is the token in STATE_DIR/token (made at the first start, mode 0600, the one
token there was before users): when the table has no user, it is registered as `admin`, and
jobs submitted before there were users become admin's. Nothing set up before breaks.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Optional

from sqlalchemy.exc import IntegrityError

from hvdcls import tables
from hvdcls.errors import UserError
from hvdcls.serve.store import Store, User

TOKEN_FILE, DATABASE = "token", "jobs.db"
FIRST_ADMIN = "admin"
TOKEN_PREFIX = "hvdcls_"  # every token made here starts so (never with "-": see new_token)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def authenticate(store: Store, token: Optional[str]) -> Optional[User]:
    return store.user_by_token(digest(token)) if token else None


def may_cancel(user: User, owner: Optional[str]) -> bool:
    return user.admin or user.name == owner


def new_token() -> str:
    """256 random bits, URL-safe, behind a prefix: a bare token_urlsafe starts with "-" one time
    in 64, and `hvdcls job list --token -x...` would read it as an option; the prefix also makes a
    leaked token easy to recognise (and grep for)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def ensure_token_file(state_dir: Path) -> str:
    """The first admin's token, made at first start: readable by the service's user only."""
    path = state_dir / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(new_token() + "\n")
    return path.read_text().strip()


def ensure_first_admin(store: Store, state_dir: Path) -> None:
    """No user yet (a new table, or one from before users): STATE_DIR/token is admin's."""
    if store.users():
        return
    token = ensure_token_file(state_dir)
    try:
        store.add_user(FIRST_ADMIN, digest(token), admin=True)
    except IntegrityError:  # a token command on the same state directory got there first
        return
    store.claim_unowned(FIRST_ADMIN)


def add(store: Store, name: str, admin: bool) -> str:
    """A new user's token (only its hash is kept)."""
    if not NAME.match(name):
        raise UserError(f"user name {name[:80]!r}: letters, digits and _ . @ - (64 at most), "
                        "starting with a letter or digit")
    if store.user(name) is not None:
        raise UserError(f"user {name} has a token already: `hvdcls serve token revoke {name}` first")
    token = new_token()
    try:
        store.add_user(name, digest(token), admin)
    except IntegrityError:
        raise UserError(f"user {name} has a token already") from None
    return token


def revoke(store: Store, name: str) -> None:
    user = store.user(name)
    if user is None:
        raise UserError(f"no user {name!r} (hvdcls serve token list)")
    if user.admin and sum(u.admin for u in store.users()) == 1:
        raise UserError(f"{name} is the last admin: add another (hvdcls serve token add NAME --admin) first")
    store.remove_user(name)


# --- the `hvdcls serve token` commands ---------------------------------------------------------

def open_store(state_dir: Path) -> Store:
    state_dir = state_dir.expanduser()
    if not state_dir.is_dir():
        raise UserError(f"--state-dir {state_dir}: no such directory (the service's, where `hvdcls serve` "
                        "keeps jobs.db)")
    store = Store(state_dir / DATABASE)
    ensure_first_admin(store, state_dir)
    return store


def run_add(args: argparse.Namespace) -> int:
    token = add(open_store(args.state_dir), args.name, args.admin)
    print(token)
    print(f"hvdcls: a token for {args.name}{' (admin)' if args.admin else ''}; shown only now, kept hashed: "
          f"give it as --token or $HVDCLS_SERVE_TOKEN", file=sys.stderr)
    return 0


def run_list(args: argparse.Namespace) -> int:
    store = open_store(args.state_dir)
    path = args.state_dir.expanduser() / TOKEN_FILE
    in_file = digest(path.read_text().strip()) if path.is_file() else None
    rows = [[u.name, "yes" if u.admin else "no", time.strftime("%Y-%m-%d %H:%M", time.localtime(u.created_at)),
             str(path) if u.token_sha256 == in_file else "-"] for u in store.users()]
    print("\n".join(tables.text(["NAME", "ADMIN", "SINCE", "TOKEN FILE"], rows)))
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    revoke(open_store(args.state_dir), args.name)
    print(f"revoked {args.name}'s token")
    return 0
