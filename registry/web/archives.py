"""Uploaded archives unpacked safely: zip and tar (gz, bz2, xz) members kept inside their tree, within the
upload limits on bytes, members and time, with errors naming the archive and the member."""
from __future__ import annotations

import os
import re
import stat
import tarfile
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

from flask import current_app

from registry.core.errors import InputError, LimitExceededError


def display_name(filename: str | None) -> str:
    """The client's file name for messages: its last component, printable, at most 100 characters."""
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable())[:100].strip()
    return name if name not in ("", ".", "..") else "upload"


def create_file(path: Path) -> IO[bytes]:
    """A new file that did not exist (no overwrite, no following a planted link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    return os.fdopen(fd, "wb")


def copy_limited(src: IO[bytes], dst: IO[bytes], budget: list[int], what: str,
                  started: float | None = None) -> None:
    """Copy with a byte budget (shared by all members) and a CPU-time budget for the decompression."""
    limits = current_app.config["LIMITS"]
    started = time.thread_time() if started is None else started
    while chunk := src.read(1 << 20):
        budget[0] -= len(chunk)
        if budget[0] < 0:
            raise LimitExceededError(f"the archive unpacks to more than {current_app.config['MAX_UNPACKED_BYTES']} "
                                     "bytes (RLREG_MAX_UNPACKED_BYTES)", what, status=413)
        if time.thread_time() - started > limits.max_decompress_seconds:
            raise LimitExceededError(f"unpacking the archive takes more than {limits.max_decompress_seconds:g} s of "
                                     "CPU time (RLREG_MAX_DECOMPRESS_SECONDS)", what)
        dst.write(chunk)


def decompressed_tar(archive: Path, shown: str) -> Path:
    """A compressed tar (gzip, bzip2, xz) unpacked to a plain tar beside it, within the byte and CPU budgets.

    tarfile would decompress the whole stream just to list the members, with no bound: a few KB of
    bzip2 can take tens of seconds. A plain tar is returned as it is."""
    import bz2
    import gzip
    import lzma

    with open(archive, "rb") as f:
        head = f.read(6)
    opener = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ": lzma.open}
    for magic, open_compressed in opener.items():
        if head.startswith(magic):
            break
    else:
        return archive
    plain = archive.with_suffix(".tar")
    budget = [int(current_app.config["MAX_UNPACKED_BYTES"]) + 1024 * int(current_app.config["MAX_ARCHIVE_MEMBERS"])]
    with open_compressed(archive, "rb") as src, create_file(plain) as dst:
        copy_limited(src, dst, budget, shown)
    archive.unlink()
    return plain


def member_path(name: str, archive: str) -> PurePosixPath:
    """An archive member's relative path, or InputError for anything that could leave the target."""
    if not name or "\x00" in name or any(ord(c) < 32 for c in name):
        raise InputError(f"member {name[:80]!r} has an unusable name", archive)
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise InputError(f"member {name[:80]!r} has an absolute path; refusing the archive", archive)
    parts = [p for p in re.split(r"[/\\]", name) if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise InputError(f"member {name[:80]!r} points outside the archive ('..'); refusing the archive", archive)
    if not parts:
        raise InputError(f"member {name[:80]!r} has an empty path", archive)
    return PurePosixPath(*parts)


def inside(root: Path, rel: PurePosixPath) -> Path:
    target = (root / rel).resolve()
    if not target.is_relative_to(root.resolve()):
        raise InputError(f"member {str(rel)[:80]!r} resolves outside the target directory")
    return target


def unpack(plan: list[tuple[Path, bool, int, Any]], tree: Path, shown: str) -> None:
    """Write checked archive members under ``tree``: (relative path, is directory, size, opener)."""
    limit = int(current_app.config["MAX_UNPACKED_BYTES"])
    if sum(size for _, is_dir, size, _ in plan if not is_dir) > limit:
        raise InputError(f"the archive unpacks to more than {limit} bytes", shown)
    budget = [limit]  # declared sizes can lie: the copy counts the bytes really written
    started = time.thread_time()
    for rel, is_dir, _, opener in plan:
        target = inside(tree, rel)
        if is_dir:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with opener() as src, create_file(target) as dst:
            copy_limited(src, dst, budget, shown, started)


def extract_zip(archive: Path, tree: Path, shown: str) -> None:
    limit_members = int(current_app.config["MAX_ARCHIVE_MEMBERS"])
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > limit_members:
            raise InputError(f"the archive has {len(infos)} members; at most {limit_members} are accepted", shown)
        plan = []
        for info in infos:
            rel = member_path(info.filename, shown)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type recorded (a plain file)
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise InputError(f"member {info.filename[:80]!r} is a link or a special file", shown)
            if info.flag_bits & 0x1:
                raise InputError(f"member {info.filename[:80]!r} is encrypted", shown)
            plan.append((rel, info.is_dir(), info.file_size, lambda info=info: zf.open(info)))
        unpack(plan, tree, shown)


def extract_tar(archive: Path, tree: Path, shown: str) -> None:
    limit_members = int(current_app.config["MAX_ARCHIVE_MEMBERS"])
    archive = decompressed_tar(archive, shown)
    with tarfile.open(archive, mode="r:") as tf:
        members = []
        for m in tf:
            members.append(m)
            if len(members) > limit_members:
                raise InputError(f"the archive has more than {limit_members} members", shown)
        plan = []
        for m in members:
            rel = member_path(m.name, shown)
            if not (m.isreg() or m.isdir()):
                raise InputError(f"member {m.name[:80]!r} is a link or a special file", shown)
            plan.append((rel, m.isdir(), m.size, lambda m=m: tar_member(tf, m, shown)))
        unpack(plan, tree, shown)


def tar_member(tf: tarfile.TarFile, member: tarfile.TarInfo, shown: str) -> Any:
    src = tf.extractfile(member)
    if src is None:
        raise InputError(f"member {member.name[:80]!r} cannot be read", shown)
    return src


def lzma_error() -> type[Exception]:
    import lzma

    return lzma.LZMAError


def archive_kind(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(262)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith(b"\x1f\x8b") or head.startswith(b"BZh") or head.startswith(b"\xfd7zXZ\x00") or \
            head[257:262] == b"ustar":
        return "tar"
    return None
