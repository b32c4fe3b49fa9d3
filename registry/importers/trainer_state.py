"""Hugging Face Trainer ``trainer_state.json`` (also what TRL's trainers write).

The file is one JSON document, so it is parsed once, with ``json.load``, when the
source is opened, and the parsed ``log_history`` is kept for the source's lifetime;
points are yielded from it one at a time and never copied into a second list. A
100 MB state file therefore costs one parse and one in-memory copy, not two.

Each ``log_history`` entry is one logging call: ``step`` is the global step and every
other numeric entry (``epoch`` included) is a metric. Strings and booleans are skipped.
Python's json module accepts the ``NaN`` / ``Infinity`` tokens the Trainer writes for
a diverged ``grad_norm``; they are kept as float NaN / Inf.

Positions are ``"log_history[i]"``, counting from 0 like the JSON array.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from registry.core.errors import InputError
from registry.core.series import Point
from registry.importers.base import Source
from registry.importers.values import as_step, as_value

FORMAT = "trainer_state"
FILE_NAME = "trainer_state.json"

# Top-level fields that are configuration, not end-of-run state like global_step or
# best_metric. They go to params under "trainer" (flattened by the store to trainer.x).
_CONFIG_FIELDS = (
    "train_batch_size", "num_train_epochs", "max_steps", "logging_steps", "eval_steps", "save_steps",
)
_TRL_PREFIXES = ("rewards/", "completions/", "objective/", "clip_ratio/", "logps/", "logits/")
_TRL_KEYS = {"kl", "reward_std", "frac_reward_zero_std"}


def sniff(path: Path, head: bytes) -> bool:
    """Whether ``path`` looks like a trainer_state.json (by content, or by its usual name)."""
    if path.is_dir():
        return (path / FILE_NAME).is_file()
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if not text.startswith("{"):
        return path.name == FILE_NAME
    first_line = text.split("\n", 1)[0]
    try:
        first = json.loads(first_line)
    except ValueError:
        # Pretty-printed (the Trainer writes indent=2, keys sorted): look for the key.
        return '"log_history"' in text or path.name == FILE_NAME
    return isinstance(first, dict) and "log_history" in first


def open_trainer_state(path: Path) -> Source:
    """A Source over ``log_history``, with the Trainer's batch/epoch settings as params."""
    file = path / FILE_NAME if path.is_dir() else path
    state = _load(file)
    history = state.get("log_history")
    if not isinstance(history, list):
        raise InputError("no log_history list: not a Trainer state file", str(file))
    del state["log_history"]  # the closure below keeps history; the rest is small

    def points() -> Iterator[Point]:
        for index, entry in enumerate(history):
            yield from _entry_points(entry, str(file), f"log_history[{index}]")

    return Source(
        path=path,
        format=FORMAT,
        points=points,
        params=_params(state),
        framework=framework_hint(history),
        name=_run_name(file, state),
        files=[file],
    )


def _load(file: Path) -> dict[str, Any]:
    try:
        with open(file, "rb") as handle:
            state = json.load(handle)
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror})", str(file)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", str(file), f"line {exc.lineno}, column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8, absurd nesting, 5000-digit ints
        raise InputError(f"not valid JSON: {exc}", str(file)) from None
    if not isinstance(state, dict):
        raise InputError(f"expected a JSON object, got {type(state).__name__}", str(file))
    return state


def _entry_points(entry: Any, source: str, position: str) -> Iterator[Point]:
    if not isinstance(entry, dict):
        raise InputError(f"log entry is {type(entry).__name__}, not an object", source, position)
    if "step" not in entry:
        raise InputError("log entry has no 'step'", source, position)
    step = as_step(entry["step"], source, position)
    for key, value in entry.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        yield Point(key, step, as_value(value, source, position), None, position)


def _params(state: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    trainer = {name: state[name] for name in _CONFIG_FIELDS if state.get(name) is not None}
    if trainer:
        params["trainer"] = trainer
    # Set only by Trainer.hyperparameter_search: the trial's own hyperparameters.
    if isinstance(state.get("trial_params"), dict):
        params.update(state["trial_params"])
    return params


def _run_name(file: Path, state: dict[str, Any]) -> str | None:
    if isinstance(state.get("trial_name"), str) and state["trial_name"]:
        return state["trial_name"]
    directory = file.parent
    # output_dir/checkpoint-500/trainer_state.json: the run is output_dir.
    if directory.name.startswith("checkpoint-") and directory.parent.name:
        directory = directory.parent
    return directory.name or None


def framework_hint(history: list[Any]) -> str | None:
    """"trl" when the logged keys are TRL's (GRPO/PPO/DPO), else None."""
    for entry in history:
        if not isinstance(entry, dict):
            continue
        for key in entry:
            if key in _TRL_KEYS or key.startswith(_TRL_PREFIXES):
                return "trl"
    return None
