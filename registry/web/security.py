"""Who is asking: session logins, bearer tokens, the access guards and the failed-credential throttle.

Every view that changes data carries :func:`write_access_required` (runs, metrics, outcomes,
status, uploads) or :func:`admin_access_required` (deleting runs, editing the dictionary and the
baselines). They accept

- ``Authorization: Bearer rlr_...`` (an API token from ``rlreg token create``) whose scope
  includes the one the view needs (``read`` < ``write`` < ``admin``; else 403): no CSRF token is
  needed, since a browser never attaches that header on its own; or
- a session login (``/login``, acting with ``admin`` scope): then the request must also carry the
  CSRF token, as the ``csrf_token`` form field or an ``X-CSRFToken`` header.

Anything else gets 401: JSON with ``WWW-Authenticate: Bearer`` under ``/api/``, a redirect to the
login page elsewhere. The acting user is :func:`current_user` (record it as the author).

Reads are open unless ``REQUIRE_LOGIN_FOR_READS`` (``RLREG_REQUIRE_LOGIN_FOR_READS=1``); then
:func:`require_login_for_reads`, installed as a ``before_request`` hook, asks any principal (a
``read`` token will do) of every page and API call except the login page and static files.

Sessions live in the database (``registry.store.auth.start_session``): the signed cookie carries only a
random session id, so logout, a password change and disabling a user end a session everywhere.

Failed credentials (:class:`Throttles`, in memory, per process) never lock out a good one:

- a bearer token is checked first, and a valid token is always accepted; a wrong one counts
  against the client address and against that token, and past the limit the client's wrong
  tokens are answered 429 with a growing ``Retry-After`` instead of 401;
- a password attempt counts against the client address and against (user name, client address);
  only that client backs off (1 s, doubling, up to ``LOGIN_MAX_BACKOFF_SECONDS``) and only once
  it is past the limit, so the right password from another client is never refused because of
  someone else's guesses.
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

from registry.store.auth import AuthError, Principal, authenticate_token, session_principal
from registry.web.context import csrf, get_registry

F = TypeVar("F", bound=Callable[..., Any])

SESSION_ID_KEY = "sid"
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
    """Failures per key within a sliding ``window``; past ``limit`` of them the key backs off.

    The wait after the ``limit``-th failure is 1 s, doubling with every further failure up to
    ``max_backoff``, counted from the last failure: a key is slowed down, never locked for good.
    Memory is bounded: at most ``max_keys`` keys are tracked, the least recently failed go first.
    """

    def __init__(self, limit: int, window: float, max_backoff: float = 300.0, max_keys: int = 10000):
        self.limit = limit
        self.window = window
        self.max_backoff = max_backoff
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
            wait = min(self.max_backoff, 2.0 ** min(len(times) - self.limit, 30))
            left = times[-1] + wait - now
            return int(left + 0.999) if left > 0 else 0

    def fail(self, keys: Iterable[str]) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                times = self._prune(key, now) or deque()
                times.append(now)
                while len(times) > self.limit + 32:  # enough to reach any backoff; bounded memory
                    times.popleft()
                self._fails[key] = times
                self._fails.move_to_end(key)
            while len(self._fails) > self.max_keys:
                self._fails.popitem(last=False)

    def reset(self, key: str) -> None:
        with self._lock:
            self._fails.pop(key, None)


class Throttles:
    """Per-credential and per-client failure windows behind one interface.

    Keys: ``client:<address>`` (limit ``LOGIN_MAX_FAILURES_PER_CLIENT``), and
    ``user:<name>|<address>`` or ``token:<hash prefix>`` (``LOGIN_MAX_FAILURES_PER_USER_AND_CLIENT``).
    """

    def __init__(self, per_credential: FailureThrottle, per_client: FailureThrottle):
        self.per_credential = per_credential
        self.per_client = per_client

    def _for(self, key: str) -> FailureThrottle:
        return self.per_client if key.startswith("client:") else self.per_credential

    def retry_after(self, keys: Iterable[str]) -> int:
        return max((self._for(k).retry_after(k) for k in keys), default=0)

    def check(self, keys: Iterable[str]) -> None:
        wait = self.retry_after(keys)
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
    """Throttle keys of a password attempt: the client address, and (user name, client address)."""
    address = request.remote_addr or "?"
    keys = [f"client:{address}"]
    if username:
        keys.append(f"user:{username.strip().lower()}|{address}")
    return keys


def _token_keys(token: str) -> list[str]:
    import hashlib

    return [f"client:{request.remote_addr or '?'}",
            "token:" + hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()[:16]]


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

    A bearer header that does not check out raises :class:`~registry.store.auth.AuthError` (answered
    401), or :class:`TooManyAttempts` (429) once this client has sent too many wrong ones; a
    valid token is checked first and always accepted.
    """
    if "rlreg_principal" in g:
        return g.rlreg_principal

    principal = None
    token = bearer_token()
    if token is not None:
        try:
            principal = authenticate_token(get_registry(), token)
        except AuthError:
            keys = _token_keys(token)
            throttle().fail(keys)
            throttle().check(keys)
            raise
    elif session.get(SESSION_ID_KEY):
        principal = session_principal(get_registry(), session[SESSION_ID_KEY])
        if principal is None:
            session.clear()  # ended elsewhere (logout, password change, user disabled) or expired
    g.rlreg_principal = principal
    return principal


def session_user() -> str | None:
    """The user logged in through the web UI in this request (for the top bar), None otherwise."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        principal = current_principal()
    except (AuthError, TooManyAttempts, SQLAlchemyError):  # an error page must still render
        return None
    return principal.username if principal is not None and principal.via == "session" else None


def current_user() -> str | None:
    """The acting user's name (record it as author), None when nobody is logged in."""
    try:
        principal = current_principal()
    except (AuthError, TooManyAttempts):
        return None
    return principal.username if principal else None


def _unauthorized(message: str):  # noqa: ANN202
    if _wants_json():
        response = jsonify({"error": message})
        response.status_code = 401
        response.headers["WWW-Authenticate"] = 'Bearer realm="rlregistry"'
        return response
    return redirect(url_for("auth.login", next=request.full_path.rstrip("?") if request.query_string else request.path))


def _forbidden(message: str):  # noqa: ANN202
    if _wants_json():
        response = jsonify({"error": message})
        response.status_code = 403
        return response
    from werkzeug.exceptions import Forbidden

    raise Forbidden(message)


def access_required(scope: str) -> Callable[[F], F]:
    """Decorator for a view that changes data: a bearer token whose scope includes ``scope``, or a
    session login plus the CSRF token. The acting user is then ``current_user()``."""

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                principal = current_principal()
            except AuthError as exc:
                return _unauthorized(str(exc))
            if principal is None:
                return _unauthorized("log in or send an API token (Authorization: Bearer <token>) to make changes")
            if not principal.allows(scope):
                return _forbidden(f"the API token {principal.token_name!r} has scope {principal.scope!r}; this "
                                  f"needs {scope!r} (rlreg token create --scope {scope})")
            if principal.via == "session":
                if request.method not in SAFE_METHODS and current_app.config.get("WTF_CSRF_ENABLED", True):
                    current_app.extensions["csrf"].protect()  # raises CSRFError -> 400
            return view(*args, **kwargs)

        # The wrapper checks CSRF itself (only for session logins), so the global check skips it.
        csrf.exempt(wrapper)
        wrapper.write_access_required = True  # type: ignore[attr-defined]
        wrapper.required_scope = scope  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


write_access_required = access_required("write")
write_access_required.__doc__ = "Runs, metrics, outcomes, status, uploads: a ``write`` token or a session login."
admin_access_required = access_required("admin")


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
    # Any scope may read.
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
    "FailureThrottle", "TooManyAttempts", "access_required", "admin_access_required", "current_principal",
    "current_user", "require_login_for_reads", "safe_next", "session_user", "write_access_required",
]
