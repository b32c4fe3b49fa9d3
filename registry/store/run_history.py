"""A run's history: every change to its editable fields, who made it and when (``RunEvent`` rows).

:func:`edit_run` replaces a run's verdict, scores, tags, notes and checkpoints as a whole (the
web UI's edit form) and records what changed in the same transaction; :func:`record_change`
records the difference :func:`editable_state` saw before a change made elsewhere (an outcome
written through the API or the CLI); :func:`delete_run` records the deletion before removing the
run. Nothing is recorded when nothing changed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from registry.core.errors import InputError
from registry.core.jsonsafe import has_unstorable_text
from registry.core.run_fields import VERDICTS
from registry.db.models import Checkpoint, OutcomeScore, Run, RunEvent, RunTag, utcnow

EDITABLE = ("verdict", "scores", "tags", "notes", "checkpoints")
MAX_TAG_LENGTH = 200
MAX_NOTES_LENGTH = 100_000


@dataclass(frozen=True)
class CheckpointEntry:
    step: int
    uri: str
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "uri": self.uri, "note": self.note}


@dataclass(frozen=True)
class RunEdit:
    """The whole new state of a run's editable fields."""

    verdict: str | None
    scores: dict[str, float]
    tags: list[str]
    notes: str | None
    checkpoints: list[CheckpointEntry]


def editable_state(session: Session, run: Run) -> dict[str, Any]:
    """The run's editable fields as JSON-ready values (read from the database, not stale collections)."""
    scores = {name: value for name, value in session.execute(
        select(OutcomeScore.name, OutcomeScore.value).where(OutcomeScore.run_id == run.id).order_by(OutcomeScore.name))}
    tags = sorted(session.scalars(select(RunTag.tag).where(RunTag.run_id == run.id)))
    checkpoints = [{"step": c.step, "uri": c.uri, "note": c.note} for c in session.scalars(
        select(Checkpoint).where(Checkpoint.run_id == run.id).order_by(Checkpoint.step))]
    return {"verdict": run.verdict, "scores": scores, "tags": tags, "notes": run.notes or None,
            "checkpoints": checkpoints}


def diff_states(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{field: {"before": ..., "after": ...}}`` for every field whose value differs."""
    return {k: {"before": before.get(k), "after": after.get(k)}
            for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)}


def record_event(session: Session, run: Run, action: str, changes: dict[str, Any], author: str | None,
                 note: str | None = None) -> RunEvent:
    event = RunEvent(run_id=run.id, run_name=run.name, at=utcnow(), author=author, action=action,
                     changes=changes, note=(note or None))
    session.add(event)
    return event


def record_change(session: Session, run: Run, before: dict[str, Any], action: str, author: str | None,
                  note: str | None = None) -> dict[str, dict[str, Any]]:
    """Record the difference between ``before`` and the run's state now (after a flush); returns it."""
    session.flush()
    changes = diff_states(before, editable_state(session, run))
    if changes:
        record_event(session, run, action, changes, author, note)
    return changes


def check_edit(edit: RunEdit, max_checkpoints: int) -> None:
    """Refuse an edit the database should not hold, naming the field."""
    if edit.verdict is not None and edit.verdict not in VERDICTS:
        raise InputError(f"verdict must be one of {', '.join(VERDICTS)} or empty; got {edit.verdict!r}")
    for name, value in edit.scores.items():
        if not name.strip() or len(name) > 200:
            raise InputError(f"score name {name[:40]!r} must be 1-200 characters")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            raise InputError(f"score {name!r} must be a number, got {value!r}")
    for tag in edit.tags:
        if not tag.strip() or len(tag) > MAX_TAG_LENGTH or any(ord(c) < 32 for c in tag):
            raise InputError(f"tag {tag[:40]!r} must be 1-{MAX_TAG_LENGTH} printable characters")
    texts = [edit.notes, edit.tags, list(edit.scores), [(c.uri, c.note) for c in edit.checkpoints]]
    if has_unstorable_text(texts):
        raise InputError("the edit contains text no database can store (a NUL or a lone surrogate)")
    if edit.notes is not None and len(edit.notes) > MAX_NOTES_LENGTH:
        raise InputError(f"notes are longer than {MAX_NOTES_LENGTH} characters")
    if len(edit.checkpoints) > max_checkpoints:
        raise InputError(f"{len(edit.checkpoints)} checkpoints; a run holds at most {max_checkpoints}")
    steps = [c.step for c in edit.checkpoints]
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    if repeated:
        raise InputError(f"checkpoint step {repeated[0]} is given twice")
    for c in edit.checkpoints:
        if not c.uri.strip() or len(c.uri) > 2000:
            raise InputError(f"checkpoint at step {c.step}: the reference must be 1-2000 characters")


def edit_run(registry: Any, ref: str, edit: RunEdit, author: str | None, note: str | None = None,
             expected_version: int | None = None) -> dict[str, dict[str, Any]]:
    """Set the run's editable fields to ``edit`` in one transaction and record what changed.

    ``expected_version``: the ``data_version`` the editor saw; if the run changed since, nothing is
    written and an InputError says so (two people editing one run do not silently overwrite
    each other). Returns the changes (empty: nothing differed, nothing recorded).
    """
    check_edit(edit, registry.limits.max_checkpoints)
    with registry.transaction() as session:
        run = registry.resolve_run(session, ref)
        if expected_version is not None and run.data_version != expected_version:
            raise InputError(f"run {run.name!r} changed since the form was opened (version {expected_version}, now "
                             f"{run.data_version}); reload the form to see the change, then edit again")
        before = editable_state(session, run)
        run.verdict = edit.verdict
        run.notes = edit.notes
        _replace_scores(session, run.id, edit.scores)
        _replace_tags(session, run.id, edit.tags)
        _replace_checkpoints(session, run.id, edit.checkpoints)
        session.expire(run, ["scores", "tags", "checkpoints"])
        changes = record_change(session, run, before, "edited", author, note)
        if changes:
            run.data_version += 1
            run.updated_at = utcnow()
        return changes


def _replace_scores(session: Session, run_id: str, scores: dict[str, float]) -> None:
    session.execute(delete(OutcomeScore).where(OutcomeScore.run_id == run_id))
    session.add_all(OutcomeScore(run_id=run_id, name=k, value=float(v)) for k, v in scores.items())


def _replace_tags(session: Session, run_id: str, tags: Iterable[str]) -> None:
    session.execute(delete(RunTag).where(RunTag.run_id == run_id))
    session.add_all(RunTag(run_id=run_id, tag=t) for t in dict.fromkeys(tags))


def _replace_checkpoints(session: Session, run_id: str, checkpoints: Sequence[CheckpointEntry]) -> None:
    session.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id))
    session.flush()  # the unique (run, step) rows must be gone before the new ones go in
    session.add_all(Checkpoint(run_id=run_id, step=c.step, uri=c.uri, note=c.note) for c in checkpoints)


def delete_run(registry: Any, ref: str, author: str | None, note: str | None = None) -> tuple[str, str]:
    """Delete a run and record the deletion (with the fields it had) in one transaction; (id, name)."""
    with registry.transaction() as session:
        run = registry.resolve_run(session, ref)
        state = editable_state(session, run)
        changes = {k: {"before": v, "after": None} for k, v in state.items() if v not in (None, [], {})}
        record_event(session, run, "deleted", changes, author, note)
        run_id, name = run.id, run.name
        session.delete(run)
    return run_id, name


def record_registration(registry: Any, run_id: str, author: str | None, source: str,
                        details: dict[str, Any]) -> None:
    """Record that ``author`` registered the run from ``source`` (an upload's file name)."""
    with registry.transaction() as session:
        run = session.get(Run, run_id)
        if run is not None:
            record_event(session, run, "registered", {"source": {"before": None, "after": source},
                                                      **{k: {"before": None, "after": v} for k, v in details.items()}},
                         author)


def history(registry: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's events, newest first, JSON-ready (also for a deleted run: its record stays)."""
    with registry.read() as session:
        events = session.scalars(select(RunEvent).where(RunEvent.run_id == run_id)
                                 .order_by(RunEvent.at.desc(), RunEvent.id.desc()))
        return [{"id": e.id, "at": e.at.isoformat() if e.at else None, "author": e.author, "action": e.action,
                 "run_name": e.run_name, "changes": e.changes or {}, "note": e.note} for e in events]


__all__ = ["CheckpointEntry", "RunEdit", "delete_run", "diff_states", "edit_run", "editable_state", "history",
           "record_change", "record_event", "record_registration"]
