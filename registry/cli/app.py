"""The ``rlreg`` group: the global ``--db`` option, opening the registry, and errors said in one line."""
from __future__ import annotations


from typing import Any

import click

from registry import open_registry
from registry.core.errors import AlreadyRegisteredError, InputError, RegistryError
from registry.cli.output import err_console


class RegistryGroup(click.Group):
    """Turns every RegistryError into a one-line message and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AlreadyRegisteredError as exc:
            # Not a failure of the input, but nothing was registered: scripts must be able to tell.
            err_console.print(f"[yellow]{exc}[/yellow]", markup=True, highlight=False)
            ctx.exit(2)
        except RegistryError as exc:
            err_console.print(f"error: {exc}", markup=False, highlight=False)
            ctx.exit(1)
        except Exception as exc:  # noqa: BLE001 - the environment failing (disk, permissions), said in one line
            message = environment_error_message(exc)
            if message is None:
                raise
            err_console.print(f"error: {message}", markup=False, highlight=False)
            ctx.exit(1)


def environment_error_message(exc: BaseException) -> str | None:
    """One line for the failures of the machine rather than of the input (None: a bug, let it show)."""
    import errno

    from sqlalchemy.exc import OperationalError

    if isinstance(exc, OperationalError):
        text = str(exc.orig) if exc.orig is not None else str(exc)
        lowered = text.lower()
        if "readonly" in lowered or "read-only" in lowered or "read only" in lowered:
            return f"the database is read-only ({text}); nothing was changed"
        if "disk is full" in lowered or "no space" in lowered or "could not extend" in lowered:
            return f"the disk is full ({text}); the transaction was rolled back, nothing was changed"
        if "disk i/o error" in lowered:
            return (f"the database could not write to disk ({text}: a full disk, a quota or a failing device); "
                    "the transaction was rolled back, nothing was changed")
        if "unable to open" in lowered or "could not connect" in lowered or "connection" in lowered:
            return f"cannot reach the database ({text})"
        return f"the database refused the operation ({text}); nothing was changed"
    if isinstance(exc, OSError) and exc.errno is not None:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return f"no space left to write{where} ({exc.strerror})"
        return f"{exc.strerror}{where}"
    if isinstance(exc, UnicodeError):
        return f"an argument or file name is not valid UTF-8 ({exc.reason})"
    return None


@click.group(cls=RegistryGroup)
@click.option("--db", "db_url", default=None,
              help="Database URL (sqlite:///path or postgresql+psycopg://...); default: RLREG_DATABASE_URL, "
                   "else ./rlregistry.db")
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """rlregistry: runs, their metrics, and what every number means."""
    ctx.obj = {"db_url": db_url}


def open_from(ctx: click.Context):  # -> Registry (imported lazily: keeps `rlreg --help` fast)
    if "registry" not in ctx.obj:
        from config import ConfigError, load_limits

        try:
            limits = load_limits()
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        ctx.obj["registry"] = open_registry(ctx.obj["db_url"], limits=limits)
        ctx.call_on_close(ctx.obj["registry"].close)
    return ctx.obj["registry"]


def read_rows_from(ctx: click.Context):  # -> RowReader | Registry
    """What reads run rows: a Core reader when the database is already at the current schema (no ORM,
    no NumPy: ``rlreg runs`` answers in a fraction of the time), else the opened registry, which
    creates or upgrades it first."""
    if "registry" in ctx.obj:
        return ctx.obj["registry"]
    from registry.db.engine import default_database_url
    from registry.store.run_listing import open_rows

    reader = open_rows(ctx.obj["db_url"] or default_database_url())
    if reader is None:
        return open_from(ctx)
    ctx.call_on_close(reader.close)
    return reader


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def parse_assignments(values: tuple[str, ...], what: str) -> list[tuple[str, str]]:
    out = []
    for item in values:
        if "=" not in item:
            raise InputError(f"{what} {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        if not key.strip():
            raise InputError(f"{what} {item!r} has an empty key")
        out.append((key.strip(), value))
    return out


def parse_semantics(values: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``--semantics actor/kl_loss:kl_estimator=k1`` -> {"actor/kl_loss": {"kl_estimator": "k1"}}."""
    out: dict[str, dict[str, str]] = {}
    for key_field, value in parse_assignments(values, "--semantics"):
        if ":" not in key_field:
            raise InputError(f"--semantics {key_field!r} must look like METRIC_KEY:FIELD=VALUE")
        key, field = key_field.rsplit(":", 1)
        out.setdefault(key, {})[field] = value
    return out
