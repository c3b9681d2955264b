"""Whole-or-nothing file writes and JSON reads with one-line errors."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ZbsearchError


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a file."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise ZbsearchError(f"cannot write {path}: folder {path.parent} does not exist (create it first)")
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def read_text(path: str | Path, what: str) -> str:
    """A file's text; a missing or unreadable file becomes one clear line naming `what` it should be."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ZbsearchError(f"{what} file {path} does not exist") from None
    except OSError as exc:
        raise ZbsearchError(f"cannot read {what} file {path}: {exc.strerror}") from None


def read_json(path: str | Path, what: str) -> Any:
    """Load JSON from a file; a missing file or bad JSON becomes one clear line."""
    path = Path(path)
    text = read_text(path, what)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ZbsearchError(f"{what} file {path} is not valid JSON: {exc}") from None


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
