"""Exceptions raised by rlregistry.

Library code raises these; the CLI and the HTTP layer catch them once and turn them
into an exit code or an error response.
"""
from __future__ import annotations


class RegistryError(Exception):
    """Base class of every error rlregistry reports to a user."""


class InputError(RegistryError):
    """A file or value supplied by the user cannot be used.

    ``source`` names the input (a path, an argument) and ``position`` where in it
    the problem is (``"line 17"``, ``"record 42"``, ``"column 'reward'"``).
    """

    def __init__(self, message: str, source: str | None = None, position: str | None = None):
        self.source = source
        self.position = position
        self.reason = message
        where = ", ".join(p for p in (source, position) if p)
        super().__init__(f"{where}: {message}" if where else message)


class UnknownFormatError(InputError):
    """No importer recognises the input."""


class StepOrderError(InputError):
    """A series has a duplicate or decreasing step where the policy forbids it."""


class NotFoundError(RegistryError):
    """A run, series or definition that was asked for does not exist."""


class AlreadyRegisteredError(RegistryError):
    """The same source was registered before; pass replace=True to register it again."""

    def __init__(self, run_id: str, run_name: str):
        self.run_id = run_id
        self.run_name = run_name
        super().__init__(
            f"this source is already registered as run {run_name!r} ({run_id}); "
            "use --replace to register it again"
        )


class FilterSyntaxError(RegistryError):
    """A filter expression could not be parsed."""

    def __init__(self, message: str, expression: str, column: int | None = None):
        self.expression = expression
        self.column = column
        pointer = f" at column {column}" if column is not None else ""
        super().__init__(f"bad filter {expression!r}{pointer}: {message}")


class DefinitionError(RegistryError):
    """A metric definition is invalid (unknown enum value, bad range, ...)."""


class LimitExceededError(InputError):
    """An input is within the format but beyond a configured bound on the work one request may cause.

    ``status`` is the HTTP answer: 413 for sizes (bytes, decompressed bytes, line length), 422 for
    counts and shapes (keys, tags, checkpoints, nesting, number size, page numbers, CPU time).
    """

    def __init__(self, message: str, source: str | None = None, position: str | None = None, *, status: int = 422):
        super().__init__(message, source, position)
        self.status = status
