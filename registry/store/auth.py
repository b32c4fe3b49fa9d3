"""Who may write: users (for the web UI) and API tokens (for the Python client and scripts).

Tokens are 32 random bytes shown once at creation; only their SHA-256 is stored (a token has
full entropy, so a slow password hash would add nothing). Passwords use Werkzeug's salted
scrypt hash. Reads may be open; every write over HTTP needs one or the other.

Every token has a scope, and each scope includes the ones before it:

- ``read``: reads (dashboards, CI checks) when the server asks a login for reads; no writes;
- ``write``: also creates runs, streams metrics, sets outcomes and status, uploads files;
- ``admin``: also deletes runs and edits the metric dictionary and the health baselines.

A web login acts with ``admin`` scope (users are the people the server trusts). Web logins are
server-side sessions (:func:`start_session`): the cookie holds a random id, the database its
hash, so :func:`end_session`, :func:`set_password` and :func:`set_user_disabled` end them in
every server process at once.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select
from werkzeug.security import check_password_hash, generate_password_hash

from registry.core.errors import InputError, NotFoundError, RegistryError
from registry.db.models import ApiToken, User, UserSession, utcnow
from registry.store.facade import Registry

TOKEN_PREFIX = "rlr_"
MIN_PASSWORD_LENGTH = 8
SCOPES = ("read", "write", "admin")  # each includes the ones before it
DEFAULT_SCOPE = "write"


class AuthError(RegistryError):
    """Missing, wrong, or revoked credentials."""


@dataclass(frozen=True)
class Principal:
    """The authenticated party behind a request."""

    username: str
    via: str  # "token" or "session"
    token_name: str | None = None
    scope: str = "admin"

    def allows(self, scope: str) -> bool:
        """Whether this principal's scope includes ``scope``."""
        return SCOPES.index(self.scope) >= SCOPES.index(scope)


def check_scope(scope: str) -> str:
    if scope not in SCOPES:
        raise InputError(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    return scope


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _check_name(value: str, what: str) -> str:
    value = (value or "").strip()
    if not value or len(value) > 100 or any(ord(c) < 32 for c in value):
        raise InputError(f"{what} must be 1-100 printable characters")
    return value


def create_user(registry: Registry, username: str, password: str) -> None:
    username = _check_name(username, "user name")
    if len(password or "") < MIN_PASSWORD_LENGTH:
        raise InputError(f"password must have at least {MIN_PASSWORD_LENGTH} characters")
    with registry.transaction() as s:
        if s.scalar(select(User).where(User.username == username)) is not None:
            raise InputError(f"user {username!r} exists already")
        s.add(User(username=username, password_hash=generate_password_hash(password)))


def check_password(registry: Registry, username: str, password: str) -> Principal:
    with registry.read() as s:
        user = s.scalar(select(User).where(User.username == username))
        # Compare against a dummy hash for unknown users so timing does not reveal which names exist.
        stored = user.password_hash if user else _DUMMY_HASH
        if not check_password_hash(stored, password or "") or user is None or user.disabled:
            raise AuthError("wrong user name or password")
        return Principal(user.username, "session")


def _user(s, username: str) -> User:  # noqa: ANN001
    user = s.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFoundError(f"no user {username!r} (create one with `rlreg user create`)")
    return user


def set_password(registry: Registry, username: str, password: str) -> int:
    """Change ``username``'s password and end every web session of theirs; returns how many ended."""
    if len(password or "") < MIN_PASSWORD_LENGTH:
        raise InputError(f"password must have at least {MIN_PASSWORD_LENGTH} characters")
    with registry.transaction() as s:
        user = _user(s, username)
        user.password_hash = generate_password_hash(password)
        return s.execute(delete(UserSession).where(UserSession.user_id == user.id)).rowcount or 0


def set_user_disabled(registry: Registry, username: str, disabled: bool) -> None:
    """Disable (or enable again) a user: a disabled user's tokens and sessions stop working at once."""
    with registry.transaction() as s:
        user = _user(s, username)
        user.disabled = disabled
        if disabled:
            s.execute(delete(UserSession).where(UserSession.user_id == user.id))


def list_users(registry: Registry) -> list[dict[str, object]]:
    with registry.read() as s:
        return [{"user": u.username, "disabled": bool(u.disabled), "created_at": u.created_at.isoformat()}
                for u in s.scalars(select(User).order_by(User.username))]


def start_session(registry: Registry, username: str, lifetime_seconds: float) -> str:
    """A new web session for ``username``; returns the random id the cookie carries (only its hash is stored)."""
    session_id = secrets.token_urlsafe(32)
    now = utcnow()
    with registry.transaction() as s:
        user = _user(s, username)
        # Expired rows of this user go on each login, so the table stays the size of the live sessions.
        s.execute(delete(UserSession).where(UserSession.user_id == user.id, UserSession.expires_at < now))
        s.add(UserSession(id_hash=_digest(session_id), user_id=user.id, created_at=now,
                          expires_at=now + timedelta(seconds=lifetime_seconds)))
    return session_id


def session_principal(registry: Registry, session_id: str) -> Principal | None:
    """The user of a live session (not ended, not expired, user enabled), None otherwise."""
    if not isinstance(session_id, str) or not session_id or len(session_id) > 200:
        return None
    with registry.read() as s:
        row = s.execute(select(User.username, User.disabled, UserSession.expires_at).join(
            UserSession, UserSession.user_id == User.id).where(UserSession.id_hash == _digest(session_id))).first()
    if row is None or row.disabled:
        return None
    expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=utcnow().tzinfo)
    if expires <= utcnow():
        return None
    return Principal(row.username, "session")


def end_session(registry: Registry, session_id: str) -> None:
    with registry.transaction() as s:
        s.execute(delete(UserSession).where(UserSession.id_hash == _digest(session_id)))


def create_token(registry: Registry, username: str, name: str, scope: str = DEFAULT_SCOPE) -> str:
    """A new token for ``username``; the returned secret is not stored and cannot be shown again."""
    name = _check_name(name, "token name")
    scope = check_scope(scope)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with registry.transaction() as s:
        user = s.scalar(select(User).where(User.username == username))
        if user is None:
            raise NotFoundError(f"no user {username!r} (create one with `rlreg user create`)")
        if s.scalar(select(ApiToken).where(ApiToken.user_id == user.id, ApiToken.name == name,
                                           ApiToken.revoked_at.is_(None))):
            raise InputError(f"user {username!r} already has an active token named {name!r}")
        s.add(ApiToken(user_id=user.id, name=name, token_hash=_digest(secret), prefix=secret[:10], scope=scope))
    return secret


def revoke_token(registry: Registry, username: str, name: str) -> None:
    with registry.transaction() as s:
        token = s.scalar(
            select(ApiToken).join(User).where(User.username == username, ApiToken.name == name,
                                              ApiToken.revoked_at.is_(None))
        )
        if token is None:
            raise NotFoundError(f"user {username!r} has no active token named {name!r}")
        token.revoked_at = utcnow()


def list_tokens(registry: Registry) -> list[dict[str, object]]:
    with registry.read() as s:
        rows = s.execute(select(ApiToken, User.username).join(User).order_by(User.username, ApiToken.name)).all()
        return [
            {"user": username, "name": t.name, "prefix": t.prefix, "scope": t.scope, "created_at": t.created_at.isoformat(),
             "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
             "revoked": t.revoked_at is not None}
            for t, username in rows
        ]


def authenticate_token(registry: Registry, secret: str) -> Principal:
    """The principal for a bearer token; AuthError when it is unknown or revoked."""
    if not secret or not secret.startswith(TOKEN_PREFIX) or len(secret) > 200:
        raise AuthError("invalid API token")
    digest = _digest(secret)
    with registry.transaction() as s:
        token = s.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
        if token is None or not hmac.compare_digest(token.token_hash, digest):
            raise AuthError("invalid API token")
        if token.revoked_at is not None:
            raise AuthError(f"API token {token.name!r} was revoked")
        user = s.get(User, token.user_id)
        if user is None or user.disabled:
            raise AuthError("the token's user is disabled")
        token.last_used_at = utcnow()
        return Principal(user.username, "token", token.name, token.scope)


_DUMMY_HASH = generate_password_hash("not-a-real-password-" + secrets.token_hex(8))
