"""Reading TensorBoard event files record by record, with TensorBoard's own loader and protobuf types.

The loader is built for tailing live files: it treats a short or corrupt record as "not written
yet" and stops without a word. A finished file must not lose its tail silently, so
:func:`read_events` counts the bytes of the records returned and, when they fall short of the
file size, reports why at that record.
"""
from __future__ import annotations

import json
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

_RECORD_OVERHEAD = 8 + 4 + 4  # length, length CRC, data CRC around each record's data


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


def scalars(
    event: event_pb2.Event, directory: str, plugins: dict[tuple[str, str], str]
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
            plugins.setdefault((directory, value.tag), plugin)
        if plugins.get((directory, value.tag)) == "scalars":
            yield value.tag, _tensor_scalar(value.tensor)


def _tensor_scalar(tensor: Any) -> float | None:
    try:
        array = tensor_util.make_ndarray(tensor)
        return float(array.reshape(())) if array.size == 1 else None
    except (TypeError, ValueError):
        return None


@dataclass
class EventScan:
    """What must be known before the first point: tags per directory, hyperparameters, warnings."""

    tags_by_dir: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    params: dict[str, Any] = field(default_factory=dict)
    text_params: dict[str, Any] = field(default_factory=dict)
    #: The Hugging Face Trainer's ``args`` text summary: its TrainingArguments (for TRL, the
    #: GRPOConfig/PPOConfig: num_iterations, epsilon, beta, ...) as a JSON object.
    trainer_args: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def scan_files(files: list[Path], root: Path) -> EventScan:
    """One pass over all files for what must be known before the first point: tags and hparams.

    It also surfaces truncation and corruption when the source is opened rather than
    halfway through registration.
    """
    scan = EventScan()
    plugins: dict[tuple[str, str], str] = {}
    not_scalar: set[tuple[str, str]] = set()
    for file in files:
        directory = run_dir(file, root)
        for record, event in read_events(file):
            for tag, value in scalars(event, directory, plugins):
                if value is not None:
                    scan.tags_by_dir[directory].add(tag)
                elif (directory, tag) not in not_scalar:
                    not_scalar.add((directory, tag))
                    scan.warnings.append(f"{file}, record {record}: tag {tag!r} is not a single number; skipped")
            scan.text_params.update(_text_hparams(event))
            scan.trainer_args.update(_trainer_args(event, file, record, scan.warnings))
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


def _trainer_args(event: event_pb2.Event, file: Path, record: int, warnings: list[str]) -> dict[str, Any]:
    """The Trainer's ``tb_writer.add_text("args", args.to_json_string())`` (transformers'
    ``TensorBoardCallback.on_train_begin``, integration_utils.py, transformers 5.25) as params."""
    for value in event.summary.value:
        if value.tag not in ("args", "args/text_summary") or value.metadata.plugin_data.plugin_name != "text":
            continue
        if not value.tensor.string_val:
            continue
        text = value.tensor.string_val[0].decode("utf-8", errors="replace")
        try:
            # NaN/Infinity stay text: a hyperparameter is stored as a finite number or as text
            args = json.loads(text, parse_constant=str)
        except json.JSONDecodeError as exc:
            warnings.append(f"{file}, record {record}: the 'args' text summary is not JSON ({exc.msg} at "
                            f"position {exc.pos}); its hyperparameters were not read")
            continue
        if isinstance(args, dict):
            return args
    return {}


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


def run_dir(file: Path, root: Path) -> str:
    """The event file's directory relative to the run's root (``.`` for the root itself)."""
    return file.parent.relative_to(root).as_posix()
