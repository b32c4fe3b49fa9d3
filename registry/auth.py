"""Who may write: users (for the web UI) and API tokens (for the Python client and scripts).

Tokens are 32 random bytes shown once at creation; only their SHA-256 is stored (a token has
full entropy, so a slow password hash would add nothing). Passwords use Werkzeug's salted
scrypt hash. Reads may be open; every write over HTTP needs one or the other.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from werkzeug.security import check_password_hash, generate_password_hash

from .errors import InputError, NotFoundError, RegistryError
from .models import ApiToken, User, utcnow
from .store import Registry

TOKEN_PREFIX = "rlr_"
MIN_PASSWORD_LENGTH = 8


class AuthError(RegistryError):
    """Missing, wrong, or revoked credentials."""


@dataclass(frozen=True)
class Principal:
    """The authenticated party behind a request."""

    username: str
    via: str  # "token" or "session"
    token_name: str | None = None


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


def create_token(registry: Registry, username: str, name: str) -> str:
    """A new token for ``username``; the returned secret is not stored and cannot be shown again."""
    name = _check_name(name, "token name")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with registry.transaction() as s:
        user = s.scalar(select(User).where(User.username == username))
        if user is None:
            raise NotFoundError(f"no user {username!r} (create one with `rlreg user create`)")
        if s.scalar(select(ApiToken).where(ApiToken.user_id == user.id, ApiToken.name == name,
                                           ApiToken.revoked_at.is_(None))):
            raise InputError(f"user {username!r} already has an active token named {name!r}")
        s.add(ApiToken(user_id=user.id, name=name, token_hash=_digest(secret), prefix=secret[:10]))
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
            {"user": username, "name": t.name, "prefix": t.prefix, "created_at": t.created_at.isoformat(),
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
        return Principal(user.username, "token", token.name)


_DUMMY_HASH = generate_password_hash("not-a-real-password-" + secrets.token_hex(8))
