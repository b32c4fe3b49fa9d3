"""TensorBoard event files: a run directory (searched recursively) or one event file.

Records are read with TensorBoard's own ``RawEventFileLoader`` and parsed with
``event_pb2``. The loader is built for tailing live files, so it treats a short or
corrupt record as "not written yet" and stops without a word; a finished file handed
to us must not lose its tail silently, so we count the bytes of the records it
returned and, if they fall short of the file size, report why at that record.

Keys are the tags. When two sub-directories (TensorFlow's ``train/`` and ``eval/``)
both log a tag, that tag is prefixed with each one's relative directory; event files
in the root directory keep the bare tag.

Positions are ``"record N"``, counting the file's records from 1 (record 1 is the
``file_version`` header every writer puts first).
"""
from __future__ import annotations

import re
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

from registry.core.errors import InputError
from registry.core.series import Point
from registry.importers.base import Source

FORMAT = "tensorboard"
EVENT_FILE_MARK = ".tfevents"
_FILE_VERSION_MARK = b"brain.Event:"
_RECORD_OVERHEAD = 8 + 4 + 4  # length, length CRC, data CRC around each record's data


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
    root = path if path.is_dir() else path.parent
    scan = _scan(files, root)
    keys = _key_map(scan.tags_by_dir)

    def points() -> Iterator[Point]:
        plugins: dict[tuple[str, str], str] = {}
        for file in files:
            run_dir = _run_dir(file, root)
            for record, event in read_events(file):
                for tag, value in _scalars(event, run_dir, plugins):
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


def read_events(file: Path) -> Iterator[tuple[int, event_pb2.Event]]:
    """Yield ``(record_number, Event)``; InputError at the first truncated or corrupt record."""
    try:
        loader = RawEventFileLoader(str(file))
    except Exception as exc:  # the stub reader raises its own NotFoundError, not OSError
        raise InputError(f"cannot open event file ({exc})", str(file)) from None
    consumed = 0
    record = 0
    for record, data in enumerate(loader.Load(), start=1):
        consumed += len(data) + _RECORD_OVERHEAD
        try:
            event = event_pb2.Event.FromString(data)
        except DecodeError:
            raise InputError("record is not a TensorBoard event", str(file), f"record {record}") from None
        yield record, event
    size = file.stat().st_size  # after reading: a live run may have grown the file meanwhile
    if consumed != size:
        raise InputError(_damage(file, consumed, size), str(file), f"record {record + 1}")


def _damage(file: Path, offset: int, size: int) -> str:
    """Why the loader stopped at ``offset``: re-read that one record's frame to say which."""
    with open(file, "rb") as handle:
        handle.seek(offset)
        frame = handle.read(12)
    remaining = size - offset
    if len(frame) < 12:
        return f"event file is truncated: {remaining} stray bytes after the last complete record"
    (length,) = struct.unpack("<Q", frame[:8])
    (length_crc,) = struct.unpack("<I", frame[8:])
    if masked_crc32c(frame[:8]) != length_crc:
        return "event file is corrupt: record header fails its CRC check"
    if remaining < length + _RECORD_OVERHEAD:
        return (
            f"event file is truncated: the record needs {length + _RECORD_OVERHEAD} bytes "
            f"but only {remaining} remain"
        )
    return "event file is corrupt: record data fails its CRC check"


def _scalars(
    event: event_pb2.Event, run_dir: str, plugins: dict[tuple[str, str], str]
) -> Iterator[tuple[str, float | None]]:
    """``(tag, value)`` for each scalar in an event: legacy ``simple_value`` or a scalars-plugin
    tensor. ``None`` marks a scalars-plugin tensor that holds more than one number.

    ``plugins`` remembers each tag's plugin per run directory, because some writers attach
    the summary metadata only to a tag's first event.
    """
    for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            yield value.tag, float(value.simple_value)
            continue
        if kind != "tensor":
            continue
        plugin = value.metadata.plugin_data.plugin_name
        if plugin:
            plugins.setdefault((run_dir, value.tag), plugin)
        if plugins.get((run_dir, value.tag)) == "scalars":
            yield value.tag, _tensor_scalar(value.tensor)


def _tensor_scalar(tensor: Any) -> float | None:
    try:
        array = tensor_util.make_ndarray(tensor)
        return float(array.reshape(())) if array.size == 1 else None
    except (TypeError, ValueError):
        return None


@dataclass
class _Scan:
    tags_by_dir: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    params: dict[str, Any] = field(default_factory=dict)
    text_params: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _scan(files: list[Path], root: Path) -> _Scan:
    """One pass over all files for what must be known before the first point: tags and hparams.

    It also surfaces truncation and corruption when the source is opened rather than
    halfway through registration.
    """
    scan = _Scan()
    plugins: dict[tuple[str, str], str] = {}
    not_scalar: set[tuple[str, str]] = set()
    for file in files:
        run_dir = _run_dir(file, root)
        for record, event in read_events(file):
            for tag, value in _scalars(event, run_dir, plugins):
                if value is not None:
                    scan.tags_by_dir[run_dir].add(tag)
                elif (run_dir, tag) not in not_scalar:
                    not_scalar.add((run_dir, tag))
                    scan.warnings.append(f"{file}, record {record}: tag {tag!r} is not a single number; skipped")
            scan.text_params.update(_text_hparams(event))
            for name, value in _hparams(event, file, record):
                if name in scan.params and scan.params[name] != value:
                    scan.warnings.append(
                        f"{file}, record {record}: hyperparameter {name!r} is {value!r} here but "
                        f"{scan.params[name]!r} in an earlier file; kept the earlier value"
                    )
                scan.params.setdefault(name, value)
    return scan


def _hparams(event: event_pb2.Event, file: Path, record: int) -> Iterator[tuple[str, Any]]:
    """Hyperparameters from an HParams ``session_start_info`` summary, as Python values."""
    for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name != "hparams":
            continue
        try:
            data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
        except DecodeError:
            raise InputError("unreadable HParams summary", str(file), f"record {record}") from None
        if data.WhichOneof("data") != "session_start_info":
            continue
        for name, hparam in sorted(data.session_start_info.hparams.items()):
            # number_value is a double whatever the writer had; 2048 comes back as 2048.0.
            yield name, MessageToDict(hparam)


def _text_hparams(event: event_pb2.Event) -> dict[str, Any]:
    """CleanRL's ``writer.add_text("hyperparameters", "|param|value|\\n|-|-|\\n|key|value|...")`` as params."""
    out: dict[str, Any] = {}
    for value in event.summary.value:
        if value.tag not in ("hyperparameters", "hyperparameters/text_summary"):
            continue
        if value.metadata.plugin_data.plugin_name != "text" or not value.tensor.string_val:
            continue
        text = value.tensor.string_val[0].decode("utf-8", errors="replace")
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 2 or cells[0] in ("param", "-", "") or set(cells[0]) <= {"-"}:
                continue
            out[cells[0]] = _typed(cells[1])
    return out


def _typed(text: str) -> Any:
    """A text cell as the Python value CleanRL printed: True/False/None, ints, floats, else text."""
    if text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _run_dir(file: Path, root: Path) -> str:
    return file.parent.relative_to(root).as_posix()


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
