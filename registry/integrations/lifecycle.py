"""Runs still open when the interpreter stops get a final status.

An uncaught exception (``sys.excepthook``) marks every open run ``crashed``; a normal exit
(``atexit``) gives each open run the status its integration chose: ``crashed`` for a trainer
callback that never saw the end of training (the exception was caught and swallowed by the
script), ``finished`` for the W&B-style entry point, whose scripts often never call ``finish``.
"""
from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any

_open: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_installed = False


def watch(run: Any, status_at_exit: str) -> None:
    """Give ``run`` (anything with ``finish(status)`` and ``finished``) a status when the process ends."""
    global _installed
    _open[run] = status_at_exit
    if not _installed:
        _installed = True
        previous = sys.excepthook

        def excepthook(exc_type, exc, tb):  # type: ignore[no-untyped-def]
            _finish_all(lambda status: "crashed")
            previous(exc_type, exc, tb)

        sys.excepthook = excepthook
        atexit.register(_finish_all, lambda status: status)


def _finish_all(choose) -> None:  # type: ignore[no-untyped-def]
    for run, status in list(_open.items()):
        if not run.finished:
            run.finish(choose(status))
        _open.pop(run, None)
