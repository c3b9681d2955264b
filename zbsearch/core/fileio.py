"""Whole-or-nothing file writes and JSON reads with one-line errors."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import FileError


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file, and
    after a crash the file holds either its old content or the new one.

    Raises FileError when the folder does not exist; an OSError while writing leaves no file behind.
    """
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise FileError(f"cannot write {path}: folder {path.parent} does not exist (create it first)")
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            # Without this the rename can reach the disk before the data: a crash then leaves an
            # empty or partial file under the final name.
            os.fsync(fh.fileno())
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable. Not every system can open a folder (Windows cannot); there the
    rename is as durable as the system makes it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def read_text(path: str | Path, what: str) -> str:
    """A file's text; a missing or unreadable file becomes one FileError line naming `what` it should be."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise FileError(f"{what} file {path} does not exist") from None
    except OSError as exc:
        raise FileError(f"cannot read {what} file {path}: {exc.strerror}") from None


def read_json(path: str | Path, what: str) -> Any:
    """Load JSON from a file; a missing file or bad JSON (NaN and Infinity included) becomes one
    FileError line."""
    path = Path(path)
    text = read_text(path, what)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise FileError(f"{what} file {path} is not valid JSON: {exc}") from None


def finite(x: float) -> bool:
    """True for a real int or float that is not NaN or infinite (booleans are not numbers here)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
