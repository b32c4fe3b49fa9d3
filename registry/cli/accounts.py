"""``rlreg user`` and ``rlreg token``: accounts and scoped API tokens for the team server."""
from __future__ import annotations



import click
from rich.table import Table

from registry.cli.app import json_option, open_from
from registry.cli.output import console, echo_json, err_console


@click.group()
def user() -> None:
    """Users who may write through the web UI."""


@user.command("create")
@click.argument("username")
@click.password_option(help="Password (asked for when omitted).")
@click.pass_context
def user_create(ctx: click.Context, username: str, password: str) -> None:
    from registry.store.auth import create_user

    create_user(open_from(ctx.find_root()), username, password)
    click.echo(f"created user {username}")


@user.command("disable")
@click.argument("username")
@click.pass_context
def user_disable(ctx: click.Context, username: str) -> None:
    """Stop a user: their tokens and web sessions stop working at once (nothing is deleted)."""
    from registry.store.auth import set_user_disabled

    set_user_disabled(open_from(ctx.find_root()), username, True)
    click.echo(f"disabled user {username}: their tokens and sessions no longer work")


@user.command("enable")
@click.argument("username")
@click.pass_context
def user_enable(ctx: click.Context, username: str) -> None:
    """Let a disabled user in again (their unrevoked tokens work again; they log in anew)."""
    from registry.store.auth import set_user_disabled

    set_user_disabled(open_from(ctx.find_root()), username, False)
    click.echo(f"enabled user {username}")


@user.command("password")
@click.argument("username")
@click.password_option(help="New password (asked for when omitted).")
@click.pass_context
def user_password(ctx: click.Context, username: str, password: str) -> None:
    """Change a user's password; every web session of theirs ends."""
    from registry.store.auth import set_password

    ended = set_password(open_from(ctx.find_root()), username, password)
    click.echo(f"changed the password of {username}; ended {ended} session(s)")


@user.command("list")
@json_option
@click.pass_context
def user_list(ctx: click.Context, as_json: bool) -> None:
    from registry.store.auth import list_users

    rows = list_users(open_from(ctx.find_root()))
    if as_json:
        echo_json(rows)
        return
    table = Table(title=f"{len(rows)} users", title_justify="left")
    for col in ("user", "created", "state"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["user"], r["created_at"][:19], "disabled" if r["disabled"] else "active")
    console.print(table)


@click.group()
def token() -> None:
    """API tokens for the Python client and scripts (sent as a bearer header)."""


@token.command("create")
@click.option("--user", "username", required=True)
@click.option("--name", required=True, help="What the token is for, e.g. 'cluster-a training'.")
@click.option("--scope", type=click.Choice(["read", "write", "admin"]), default="write", show_default=True,
              help="read: reads only (dashboards, CI); write: also runs, metrics, outcomes, uploads; "
                   "admin: also deleting runs and editing the dictionary and baselines.")
@click.pass_context
def token_create(ctx: click.Context, username: str, name: str, scope: str) -> None:
    """Create a token; its secret is printed once and never stored."""
    from registry.store.auth import create_token

    secret = create_token(open_from(ctx.find_root()), username, name, scope)
    click.echo(secret)
    err_console.print("store it now: only its hash is kept, it cannot be shown again", style="yellow")


@token.command("revoke")
@click.option("--user", "username", required=True)
@click.option("--name", required=True)
@click.pass_context
def token_revoke(ctx: click.Context, username: str, name: str) -> None:
    from registry.store.auth import revoke_token

    revoke_token(open_from(ctx.find_root()), username, name)
    click.echo(f"revoked token {name!r} of {username}")


@token.command("list")
@json_option
@click.pass_context
def token_list(ctx: click.Context, as_json: bool) -> None:
    from registry.store.auth import list_tokens

    rows = list_tokens(open_from(ctx.find_root()))
    if as_json:
        echo_json(rows)
        return
    table = Table(title=f"{len(rows)} tokens", title_justify="left")
    for col in ("user", "name", "scope", "prefix", "created", "last used", "state"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["user"], r["name"], r["scope"], r["prefix"] + "...", r["created_at"][:19],
                      (r["last_used_at"] or "")[:19], "revoked" if r["revoked"] else "active")
    console.print(table)
