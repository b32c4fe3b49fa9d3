"""Users and API tokens: hashed at rest, revocable, checked in constant time."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from registry import Registry, open_registry
from registry.store.auth import AuthError, authenticate_token, check_password, create_token, create_user, revoke_token
from registry.cli.main import cli
from registry.core.errors import InputError
from registry.db.models import ApiToken, User


def test_token_life_cycle(registry: Registry):
    create_user(registry, "alice", "correct horse")
    secret = create_token(registry, "alice", "laptop")
    assert authenticate_token(registry, secret).username == "alice"
    with registry.read() as s:
        stored = s.scalar(select(ApiToken))
        assert secret not in (stored.token_hash, stored.prefix) and stored.last_used_at is not None
        assert "correct horse" not in s.scalar(select(User)).password_hash
    with pytest.raises(AuthError, match="invalid"):
        authenticate_token(registry, secret[:-1] + ("A" if secret[-1] != "A" else "B"))
    revoke_token(registry, "alice", "laptop")
    with pytest.raises(AuthError, match="revoked"):
        authenticate_token(registry, secret)
    assert authenticate_token(registry, create_token(registry, "alice", "laptop")).token_name == "laptop"


def test_passwords(registry: Registry):
    create_user(registry, "bob", "long enough")
    assert check_password(registry, "bob", "long enough").username == "bob"
    for name, pw in (("bob", "wrong one!"), ("nobody", "long enough")):
        with pytest.raises(AuthError, match="wrong user name or password"):
            check_password(registry, name, pw)
    with pytest.raises(InputError, match="at least 8"):
        create_user(registry, "carol", "short")
    with pytest.raises(InputError, match="exists already"):
        create_user(registry, "bob", "another password")


def test_cli_token_commands(sqlite_url: str):
    runner = CliRunner()
    assert runner.invoke(cli, ["--db", sqlite_url, "user", "create", "dana", "--password",
                               "s3cret-pass"]).exit_code == 0
    out = runner.invoke(cli, ["--db", sqlite_url, "token", "create", "--user", "dana", "--name", "ci"])
    assert out.exit_code == 0
    secret = out.output.splitlines()[0]
    assert secret.startswith("rlr_")
    listing = runner.invoke(cli, ["--db", sqlite_url, "token", "list", "--json"]).output
    assert '"name": "ci"' in listing and secret not in listing
    assert runner.invoke(cli, ["--db", sqlite_url, "token", "revoke", "--user", "dana", "--name", "ci"]).exit_code == 0
    with pytest.raises(AuthError):
        authenticate_token(open_registry(sqlite_url), secret)
    missing = runner.invoke(cli, ["--db", sqlite_url, "token", "create", "--user", "nobody", "--name", "x"])
    assert missing.exit_code == 1 and "no user 'nobody'" in missing.output
