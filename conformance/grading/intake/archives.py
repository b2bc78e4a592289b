"""Safe extraction of ``.zip`` submissions.

A submitted archive is untrusted input. Extraction refuses, instead of writing anything
outside the destination: absolute names, ``..`` components, drive letters, symbolic links and
device files; and it stops at caps on the number of members, the size of one member and the
total size, counted on the bytes actually decompressed (a header can lie about sizes, and a
small archive can expand a thousandfold). Nested archives are kept as files, never opened.
Junk that archivers add (``__MACOSX/``, ``.DS_Store``) is skipped.
"""

from __future__ import annotations

import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from conformance.errors import ConformanceError

JUNK_PARTS = frozenset({"__MACOSX", ".DS_Store", "__pycache__", ".git", ".ipynb_checkpoints",
                        ".hypothesis", ".pytest_cache"})


class ArchiveError(ConformanceError):
    """An archive that can't be used; one line for the student's row."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps on what one archive may expand to."""

    max_members: int = 2000
    max_member_bytes: int = 20 * 2**20
    max_total_bytes: int = 100 * 2**20


def is_junk(parts: tuple[str, ...]) -> bool:
    """Whether a path (as parts) is archiver or editor debris, not part of the submission."""
    return any(part in JUNK_PARTS or part.startswith("._") for part in parts) or (
        bool(parts) and parts[-1].endswith((".pyc", ".pyo")))


def _safe_parts(name: str) -> tuple[str, ...]:
    """The member's path as parts, or ArchiveError when it would leave the destination."""
    text = name.replace("\\", "/")
    if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
        raise ArchiveError(f"refused: member {name!r} has an absolute path")
    parts = tuple(part for part in PurePosixPath(text).parts if part not in ("", "."))
    if any(part == ".." for part in parts):
        raise ArchiveError(f"refused: member {name!r} climbs out of the archive (..)")
    return parts


def extract_zip(archive: Path, destination: Path, limits: ArchiveLimits = ArchiveLimits()) -> list[Path]:
    """Extract ``archive`` into ``destination`` (created); the files written, relative to it.

    A single top-level folder holding everything is flattened away, as students often zip
    the folder rather than its contents. Raises ArchiveError with one line on any refusal.
    """
    try:
        handle = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise ArchiveError(f"{archive.name} is not a readable zip archive ({error})") from None
    written: list[Path] = []
    with handle:
        members = handle.infolist()
        if len(members) > limits.max_members:
            raise ArchiveError(f"{archive.name} has {len(members)} members (the limit is "
                               f"{limits.max_members})")
        planned: list[tuple[zipfile.ZipInfo, tuple[str, ...]]] = []
        for info in members:
            parts = _safe_parts(info.filename)
            # Unix archivers store the file type in the high bits; Windows ones store none.
            kind = stat.S_IFMT(info.external_attr >> 16)
            if kind == stat.S_IFLNK:
                raise ArchiveError(f"refused: member {info.filename!r} is a symbolic link")
            if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                raise ArchiveError(f"refused: member {info.filename!r} is not a plain file")
            if info.is_dir() or not parts or is_junk(parts):
                continue
            if info.flag_bits & 0x1:
                raise ArchiveError(f"{archive.name} is encrypted")
            planned.append((info, parts))
        tops = {parts[0] for _, parts in planned}
        strip = 1 if len(tops) == 1 and all(len(parts) > 1 for _, parts in planned) else 0
        destination.mkdir(parents=True, exist_ok=True)
        total = 0
        for info, parts in planned:
            relative = Path(*parts[strip:])
            target = destination / relative
            # Belt and braces: the resolved path must stay inside the destination.
            if not target.resolve().is_relative_to(destination.resolve()):
                raise ArchiveError(f"refused: member {info.filename!r} leaves the destination")
            target.parent.mkdir(parents=True, exist_ok=True)
            size = 0
            try:
                with handle.open(info) as source, target.open("wb") as sink:
                    while chunk := source.read(1 << 16):
                        size += len(chunk)
                        total += len(chunk)
                        if size > limits.max_member_bytes:
                            raise ArchiveError(f"{info.filename!r} expands past "
                                               f"{limits.max_member_bytes // 2**20} MiB")
                        if total > limits.max_total_bytes:
                            raise ArchiveError(f"{archive.name} expands past "
                                               f"{limits.max_total_bytes // 2**20} MiB")
                        sink.write(chunk)
            except ArchiveError:
                shutil.rmtree(destination, ignore_errors=True)
                raise
            except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, ValueError) as error:
                shutil.rmtree(destination, ignore_errors=True)
                raise ArchiveError(f"{archive.name}: {info.filename!r} can't be read "
                                   f"({error})") from None
            written.append(relative)
    return written
