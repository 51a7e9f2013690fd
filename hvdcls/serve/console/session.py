"""Who is signed in to the console: a session per sign-in, kept in the job table's database and
named by a random cookie, and the checks every changing request passes.

A browser cannot send the API's `Authorization: Bearer` header from a link or a form, so the
console trades the user's token (hvdcls.serve.users) once, at sign-in, for a session. The
cookie holds only the session's random id (HttpOnly: no script reads it; SameSite=Strict: no
other site's page sends it). The database keeps the SHA-256 of that id, never the id, and the
SHA-256 of the user's token (its `console_sessions` table), so a session survives a restart of
the service while a copied database opens none. The user is looked up by the token's hash on
every request, so `hvdcls serve token revoke` ends the user's sessions too (and deletes them).
A session unused for IDLE_SECONDS (12 hours) is over; its CSRF token is derived from its id.

Changing requests (sign-in, sign-out, cancel) must come from the console's own pages: their
Origin (else Referer) must be this service's, and all but the sign-in carry the session's CSRF
token (a form field or the X-CSRF-Token header), compared in constant time. SameSite=Strict
alone would do in current browsers; the two checks keep an older browser, or a sibling
subdomain, from forging a cancel.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from hvdcls.serve import users
from hvdcls.serve.store import Store, User

COOKIE = "hvdcls_session"
CSRF_FIELD, CSRF_HEADER = "csrf", "x-csrf-token"
IDLE_SECONDS = 12 * 3600  # a session unused this long is over
MAX_SESSIONS = 10_000  # beyond this the least recently used goes (each needs a valid token)
TOUCH_SECONDS = 60  # last_seen is written at most this often: a page polls every 2 s


@dataclass
class Session:
    token_sha256: str
    csrf: str
    last_seen: float


def id_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def csrf_of(session_id: str) -> str:
    """The session's CSRF token, derived from its id (kept nowhere; another hash than the
    stored one, so neither gives the other or the id)."""
    return hmac.new(session_id.encode(), b"hvdcls console csrf", hashlib.sha256).hexdigest()


class Sessions:
    def __init__(self, store: Store, idle_seconds: float = IDLE_SECONDS, max_sessions: int = MAX_SESSIONS):
        self.store, self.idle_seconds, self.max_sessions = store, idle_seconds, max_sessions

    def sign_in(self, token: str) -> Optional[tuple[str, User]]:
        """(a new session id, its user) for a known token; None for any other."""
        user = users.authenticate(self.store, token.strip() or None)
        if user is None:
            return None
        session_id, now = secrets.token_urlsafe(32), time.time()
        self.store.remove_console_sessions(seen_before=now - self.idle_seconds)  # the idle ones, now and then
        self.store.add_console_session(id_hash(session_id), user.token_sha256, now, self.max_sessions)
        return session_id, user

    def find(self, session_id: Optional[str]) -> Optional[tuple[Session, User]]:
        """The session and its user, while both live (not idle too long, token not revoked)."""
        if not session_id:
            return None
        now, key = time.time(), id_hash(session_id)
        kept = self.store.console_session(key)
        if kept is None:
            return None
        if now - kept.last_seen > self.idle_seconds:
            self.store.remove_console_sessions(key)
            return None
        user = self.store.user_by_token(kept.token_sha256)
        if user is None:  # revoked (or a new token) since: the session ends with it
            self.store.remove_console_sessions(key)
            return None
        if now - kept.last_seen > TOUCH_SECONDS:
            self.store.touch_console_session(key, now)
        return Session(kept.token_sha256, csrf_of(session_id), now), user

    def sign_out(self, session_id: Optional[str]) -> None:
        if session_id:
            self.store.remove_console_sessions(id_hash(session_id))


def set_cookie(response: Response, request: Request, session_id: str) -> None:
    """A cookie for this browser session only (no Max-Age), never readable by scripts, never
    sent from another site's page; Secure when the console is reached over HTTPS."""
    response.set_cookie(COOKIE, session_id, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """The request came from a page of this service: its Origin (or, without one, its
    Referer's origin) is the one the browser addressed. Neither header: refused."""
    sent = request.headers.get("origin") or request.headers.get("referer")
    if not sent or sent == "null":
        return False
    parts = urlsplit(sent)
    return f"{parts.scheme}://{parts.netloc}" == f"{request.url.scheme}://{request.headers.get('host', '')}"


def csrf_ok(session: Session, sent: Optional[str]) -> bool:
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), str(sent).encode())
