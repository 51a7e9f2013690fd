"""Who is signed in to the console: a session per sign-in, held in the service's memory and
named by a random cookie, and the checks every changing request passes.

A browser cannot send the API's `Authorization: Bearer` header from a link or a form, so the
console trades the user's token (hvdcls.serve.users) once, at sign-in, for a session. The
cookie holds only the session's random id (HttpOnly: no script reads it; SameSite=Strict: no
other site's page sends it); the session keeps the token's SHA-256, not the token, and the
user is looked up by it on every request, so `hvdcls serve token revoke` ends the user's
sessions too. A restart of the service signs everyone out, which costs a sign-in.

Changing requests (sign-in, sign-out, cancel) must come from the console's own pages: their
Origin (else Referer) must be this service's, and all but the sign-in carry the session's CSRF
token (a form field or the X-CSRF-Token header), compared in constant time. SameSite=Strict
alone would do in current browsers; the two checks keep an older browser, or a sibling
subdomain, from forging a cancel.
"""
from __future__ import annotations

import hmac
import secrets
import threading
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
IDLE_SECONDS = 12 * 3600  # a session unused this long is forgotten
MAX_SESSIONS = 10_000  # beyond this the least recently used goes (each needs a valid token)


@dataclass
class Session:
    token_sha256: str
    csrf: str
    last_seen: float


class Sessions:
    def __init__(self, store: Store, idle_seconds: float = IDLE_SECONDS, max_sessions: int = MAX_SESSIONS):
        self.store, self.idle_seconds, self.max_sessions = store, idle_seconds, max_sessions
        self.held: dict[str, Session] = {}
        self.lock = threading.Lock()

    def sign_in(self, token: str) -> Optional[tuple[str, User]]:
        """(a new session id, its user) for a known token; None for any other."""
        user = users.authenticate(self.store, token.strip() or None)
        if user is None:
            return None
        session_id = secrets.token_urlsafe(32)
        with self.lock:
            if len(self.held) >= self.max_sessions:
                del self.held[min(self.held, key=lambda k: self.held[k].last_seen)]
            self.held[session_id] = Session(user.token_sha256, secrets.token_urlsafe(32), time.time())
        return session_id, user

    def find(self, session_id: Optional[str]) -> Optional[tuple[Session, User]]:
        """The session and its user, while both live (not idle too long, token not revoked)."""
        if not session_id:
            return None
        now = time.time()
        with self.lock:
            session = self.held.get(session_id)
            if session is None or now - session.last_seen > self.idle_seconds:
                self.held.pop(session_id, None)
                return None
            session.last_seen = now
        user = self.store.user_by_token(session.token_sha256)
        if user is None:  # revoked (or a new token) since: the session ends with it
            self.sign_out(session_id)
            return None
        return session, user

    def sign_out(self, session_id: Optional[str]) -> None:
        with self.lock:
            self.held.pop(session_id or "", None)


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
