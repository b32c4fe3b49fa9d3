"""Who is asking: session logins, bearer tokens, the write guard and the failed-login throttle.

Every write view carries :func:`write_access_required`. It accepts

- ``Authorization: Bearer rlr_...`` (an API token from ``rlreg token create``): no CSRF token is
  needed, since a browser never attaches that header on its own; or
- a session login (``/login``): then the request must also carry the CSRF token, as the
  ``csrf_token`` form field or an ``X-CSRFToken`` header, whatever blueprint the view is in.

Anything else gets 401: JSON with ``WWW-Authenticate: Bearer`` under ``/api/``, a redirect to the
login page elsewhere. The acting user is :func:`current_user` (record it as the author).

Reads are open unless ``REQUIRE_LOGIN_FOR_READS`` (``RLREG_REQUIRE_LOGIN_FOR_READS=1``); then
:func:`require_login_for_reads`, installed as a ``before_request`` hook, asks the same of every
page and API call except the login page and static files.

Failed logins and failed token checks are throttled per client address and per user name
(:class:`FailureThrottle`, in memory: one process's count, reset on restart; a deployment with
several worker processes has one throttle per process).
"""
from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, TypeVar
from urllib.parse import urlsplit

from flask import current_app, g, jsonify, redirect, request, session, url_for
from werkzeug.exceptions import HTTPException

from ..auth import AuthError, Principal, authenticate_token

F = TypeVar("F", bound=Callable[..., Any])

SESSION_USER_KEY = "user"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Endpoints that stay reachable without a login when reads need one.
PUBLIC_ENDPOINTS = frozenset({"auth.login", "auth.logout", "static"})


class TooManyAttempts(HTTPException):
    code = 429
    description = "too many failed attempts; wait and try again"

    def __init__(self, retry_after: int):
        super().__init__(f"too many failed attempts; try again in {retry_after} s")
        self.retry_after = retry_after

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return [*super().get_headers(environ, scope), ("Retry-After", str(self.retry_after))]


class FailureThrottle:
    """At most ``limit`` failures per key within ``window`` seconds (a sliding window).

    Memory is bounded: at most ``max_keys`` keys are tracked, the least recently failed go first.
    """

    def __init__(self, limit: int, window: float, max_keys: int = 10000):
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self._fails: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _prune(self, key: str, now: float) -> deque[float] | None:
        times = self._fails.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._fails[key]
            return None
        return times

    def retry_after(self, key: str) -> int:
        """Seconds until ``key`` may try again (0: now)."""
        now = time.monotonic()
        with self._lock:
            times = self._prune(key, now)
            if times is None or len(times) < self.limit:
                return 0
            return max(1, int(times[0] + self.window - now + 0.999))

    def check(self, keys: Iterable[str]) -> None:
        wait = max((self.retry_after(k) for k in keys), default=0)
        if wait:
            raise TooManyAttempts(wait)

    def fail(self, keys: Iterable[str]) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                times = self._prune(key, now) or deque()
                times.append(now)
                self._fails[key] = times
                self._fails.move_to_end(key)
            while len(self._fails) > self.max_keys:
                self._fails.popitem(last=False)

    def reset(self, key: str) -> None:
        with self._lock:
            self._fails.pop(key, None)


class Throttles:
    """Per-user and per-address failure windows behind one interface (keys ``user:...`` / ``ip:...``)."""

    def __init__(self, per_user: FailureThrottle, per_ip: FailureThrottle):
        self.per_user = per_user
        self.per_ip = per_ip

    def _for(self, key: str) -> FailureThrottle:
        return self.per_ip if key.startswith("ip:") else self.per_user

    def check(self, keys: Iterable[str]) -> None:
        wait = max((self._for(k).retry_after(k) for k in keys), default=0)
        if wait:
            raise TooManyAttempts(wait)

    def fail(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._for(key).fail([key])

    def reset(self, key: str) -> None:
        self._for(key).reset(key)


def throttle() -> Throttles:
    return current_app.extensions["rlregistry.throttle"]


def client_keys(username: str | None = None) -> list[str]:
    """Throttle keys of this request: the client address, and the user name tried (if any)."""
    keys = [f"ip:{request.remote_addr or '?'}"]
    if username:
        keys.append(f"user:{username.strip().lower()}")
    return keys


def _wants_json() -> bool:
    return request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json"


def bearer_token() -> str | None:
    """The token of an ``Authorization: Bearer`` header, None without one."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or ""


def current_principal() -> Principal | None:
    """The authenticated party of this request (token first, then session), or None.

    A bearer header that does not check out raises :class:`~registry.auth.AuthError`
    (answered 401); failures count against the client address in the throttle.
    """
    if "rlreg_principal" in g:
        return g.rlreg_principal
    principal = None
    token = bearer_token()
    if token is not None:
        keys = client_keys()
        throttle().check(keys)
        from . import get_registry

        try:
            principal = authenticate_token(get_registry(), token)
        except AuthError:
            throttle().fail(keys)
            raise
    elif session.get(SESSION_USER_KEY):
        principal = Principal(session[SESSION_USER_KEY], "session")
    g.rlreg_principal = principal
    return principal


def current_user() -> str | None:
    """The acting user's name (record it as author), None when nobody is logged in."""
    try:
        principal = current_principal()
    except AuthError:
        return None
    return principal.username if principal else None


def _unauthorized(message: str):  # noqa: ANN202
    if _wants_json():
        response = jsonify({"error": message})
        response.status_code = 401
        response.headers["WWW-Authenticate"] = 'Bearer realm="rlregistry"'
        return response
    return redirect(url_for("auth.login", next=request.full_path.rstrip("?") if request.query_string else request.path))


def _session_user_is_active(username: str) -> bool:
    from sqlalchemy import select

    from ..models import User
    from . import get_registry

    with get_registry().read() as s:
        user = s.scalar(select(User).where(User.username == username))
        return user is not None and not user.disabled


def write_access_required(view: F) -> F:
    """Decorator for every view that changes data: a bearer token, or a session login plus CSRF token.

    The acting user is then ``current_user()`` / ``g.rlreg_principal``. Put it on the
    baseline build/edit views too; it works in any blueprint, CSRF-exempt or not.
    """

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            principal = current_principal()
        except AuthError as exc:
            return _unauthorized(str(exc))
        if principal is None:
            return _unauthorized("log in or send an API token (Authorization: Bearer <token>) to make changes")
        if principal.via == "session":
            if not _session_user_is_active(principal.username):
                session.clear()
                g.rlreg_principal = None
                return _unauthorized("your account is disabled or was removed; log in again")
            if request.method not in SAFE_METHODS and current_app.config.get("WTF_CSRF_ENABLED", True):
                current_app.extensions["csrf"].protect()  # raises CSRFError -> 400
        return view(*args, **kwargs)

    from . import csrf

    # The wrapper checks CSRF itself (only for session logins), so the global check skips it.
    csrf.exempt(wrapper)
    wrapper.write_access_required = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def require_login_for_reads():  # noqa: ANN201 - a before_request hook
    """Installed when REQUIRE_LOGIN_FOR_READS: every endpoint but login and static needs a principal."""
    if not current_app.config.get("REQUIRE_LOGIN_FOR_READS"):
        return None
    if request.endpoint in PUBLIC_ENDPOINTS or request.endpoint is None:
        return None
    view = current_app.view_functions.get(request.endpoint)
    if getattr(view, "write_access_required", False):
        return None  # the view checks for itself
    try:
        principal = current_principal()
    except AuthError as exc:
        return _unauthorized(str(exc))
    if principal is None:
        return _unauthorized("log in or send an API token (Authorization: Bearer <token>) to read this registry")
    return None


def safe_next(target: str | None) -> str | None:
    """``target`` if it is a path on this site (no scheme, no host, no ``//``), else None."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or any(ord(c) < 32 for c in target):
        return None
    return target


__all__ = [
    "FailureThrottle", "TooManyAttempts", "current_principal", "current_user", "require_login_for_reads",
    "safe_next", "write_access_required",
]
