"""TensorBoard event files: a run directory (searched recursively) or one event file.

Keys are the tags. When two sub-directories (TensorFlow's ``train/`` and ``eval/``)
both log a tag, that tag is prefixed with each one's relative directory; event files
in the root directory keep the bare tag.

Positions are ``"record N"``, counting the file's records from 1 (record 1 is the
``file_version`` header every writer puts first).

Reading records is :mod:`registry.importers.tfevents`, imported when a file is opened: TensorBoard's
protobuf modules cost ~90 ms, which commands that never read an event file should not pay.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

from registry.core.errors import InputError
from registry.core.series import Point
from registry.importers.base import Source

FORMAT = "tensorboard"
EVENT_FILE_MARK = ".tfevents"
_FILE_VERSION_MARK = b"brain.Event:"


def sniff(path: Path, head: bytes) -> bool:
    """Whether ``path`` is an event file or a directory holding some."""
    if path.is_dir():
        return bool(event_files(path))
    return EVENT_FILE_MARK in path.name or _FILE_VERSION_MARK in head[:128]


def open_tensorboard(path: Path) -> Source:
    """A Source over every event file under ``path``, with hparams and a framework hint."""
    files = event_files(path) if path.is_dir() else [path]
    if not files:
        raise InputError("no TensorBoard event files (events.out.tfevents.*) found", str(path))
    from registry.importers import tfevents

    root = path if path.is_dir() else path.parent
    scan = tfevents.scan_files(files, root)
    keys = _key_map(scan.tags_by_dir)

    def points() -> Iterator[Point]:
        plugins: dict[tuple[str, str], str] = {}
        for file in files:
            run_dir = tfevents.run_dir(file, root)
            for record, event in tfevents.read_events(file):
                for tag, value in tfevents.scalars(event, run_dir, plugins):
                    if value is not None:
                        # .get: a live run may have logged a new tag since the scan.
                        key = keys.get((run_dir, tag), tag)
                        yield Point(key, int(event.step), value, event.wall_time, f"record {record}")

    tags = {tag for run_tags in scan.tags_by_dir.values() for tag in run_tags}
    run_dir = path if path.is_dir() else path.parent
    params = dict(scan.params)
    named = cleanrl_run_name(run_dir.name)
    layout: dict[str, Any] = {}
    if scan.text_params:
        layout["hyperparameters"] = "CleanRL 'hyperparameters' text summary read as params"
        for key, value in scan.text_params.items():
            params.setdefault(key, value)
    if scan.trainer_args:
        layout["hyperparameters"] = ("Hugging Face Trainer 'args' text summary (its TrainingArguments, for TRL "
                                     "the trainer's config) read as params")
        for key, value in scan.trainer_args.items():
            params.setdefault(key, value)
    if named:
        layout["run name"] = "{env_id}__{exp_name}__{seed}__{time}"
        params.setdefault("seed", named["seed"])
        params.setdefault("exp_name", named["exp_name"])
    framework = framework_hint(tags)  # bare tags: PPO_1/ and PPO_2/ prefixes must not hide SB3
    if framework is None and scan.text_params and named:
        framework = "cleanrl"
    return Source(
        path=path,
        format=FORMAT,
        points=points,
        params=params,
        framework=framework,
        name=run_dir.name or None,
        task=_task(params) or (named or {}).get("env_id"),
        files=files,
        warnings=scan.warnings,
        layout=layout,
    )


# CleanRL: run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}" (cleanrl/ppo.py).
_CLEANRL_RUN = re.compile(r"^(?P<env_id>.+?)__(?P<exp_name>.+)__(?P<seed>-?\d+)__(?P<time>\d{9,})$")
_RUN_SPLITS = {"train", "eval", "evaluation", "validation", "val", "test"}


def cleanrl_run_name(name: str) -> dict[str, Any] | None:
    """``CartPole-v1__ppo__1__1700000000`` -> env_id, exp_name, seed, time; None for other names."""
    m = _CLEANRL_RUN.match(name)
    if not m:
        return None
    return {"env_id": m["env_id"], "exp_name": m["exp_name"], "seed": int(m["seed"]), "time": int(m["time"])}


def run_directories(directory: Path) -> list[Path]:
    """Sub-directories that are separate runs (SB3's ``PPO_1/``, CleanRL's ``runs/<name>/``), or [].

    A directory is several runs when it has no event file of its own and at least two of its
    immediate sub-directories hold event files, none of them named like a split of one run
    (TensorFlow's ``train/`` and ``eval/``).
    """
    if any(p.is_file() and EVENT_FILE_MARK in p.name for p in directory.iterdir()):
        return []
    subdirs = sorted(p for p in directory.iterdir() if p.is_dir() and event_files(p))
    if len(subdirs) < 2 or any(p.name.lower() in _RUN_SPLITS for p in subdirs):
        return []
    return subdirs


def event_files(directory: Path) -> list[Path]:
    """Event files under ``directory``, sorted by path (the file names start with a timestamp)."""
    return sorted(p for p in directory.rglob(f"*{EVENT_FILE_MARK}*") if p.is_file())


def _key_map(tags_by_dir: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """Key for each (run dir, tag): the tag, prefixed by the dir when dirs share the tag."""
    owners: dict[str, int] = defaultdict(int)
    for tags in tags_by_dir.values():
        for tag in tags:
            owners[tag] += 1
    return {
        (run_dir, tag): tag if owners[tag] == 1 or run_dir == "." else f"{run_dir}/{tag}"
        for run_dir, tags in tags_by_dir.items()
        for tag in tags
    }


def _task(params: dict[str, Any]) -> str | None:
    for name in ("env", "env_id", "env_name", "task"):
        if isinstance(params.get(name), str):
            return params[name]
    return None


def framework_hint(keys: set[str]) -> str | None:
    """A framework guess from the tag names alone; real detection lives elsewhere."""
    if {"rollout/ep_rew_mean", "train/approx_kl"} <= keys:
        return "stable-baselines3"
    if "charts/episodic_return" in keys and any(k.startswith("losses/") for k in keys):
        return "cleanrl"
    return None
