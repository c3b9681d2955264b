"""The append-only results file of a whole-run search: JSON lines, a header first, then one line per finished
shape (its bound, its result, or the reason it failed), each written and synced to disk as the shape ends.

An interrupted search (Ctrl-C, a killed process, a lost worker) thus loses only the shapes in flight: run
again with the same arguments and the same file, and the finished shapes are read back instead of run again.
The header holds a fingerprint of the arguments (a stable hash of their canonical JSON), so a file written
under other arguments is refused rather than mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...core.errors import PlanError
from ...core.fileio import write_atomic

FORMAT = "zbsearch-wholerun-results"
VERSION = 1


def fingerprint(arguments: Mapping[str, Any]) -> str:
    """A stable hash of `arguments` (plain JSON data): sha256 of its canonical JSON, keys sorted.

    >>> fingerprint({"b": 1, "a": [1, 2]}) == fingerprint({"a": [1, 2], "b": 1})
    True
    """
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class ResultsFile:
    """An open results file: `finished`, the entries read back when it was opened (oldest first); `append`
    adds one."""

    path: Path
    fingerprint: str
    finished: list[dict[str, Any]]

    @classmethod
    def open(cls, path: str | Path, arguments: Mapping[str, Any]) -> "ResultsFile":
        """The file at `path` for a search under `arguments`: a new one (its header written whole, by a
        rename, so no reader ever sees half a header), or an existing one written under the same arguments,
        whose finished entries are read back.

        Raises
        ------
        PlanError
            The file was written under other arguments, is not a results file, or holds a damaged line
            before its last.
        """
        path, mark = Path(path), fingerprint(arguments)
        if not path.exists() or path.stat().st_size == 0:
            header = {"format": FORMAT, "version": VERSION, "fingerprint": mark, "arguments": arguments}
            write_atomic(path, json.dumps(header, sort_keys=True, allow_nan=False) + "\n")
            return cls(path, mark, [])
        return cls(path, mark, _read(path, mark))

    def append(self, entry: Mapping[str, Any]) -> None:
        """Add one line and sync it to disk before returning: a shape reported finished is on disk."""
        line = json.dumps(entry, sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


def _refuse(path: Path, why: str) -> PlanError:
    return PlanError(f"results file {path} {why}: give another path for this search's results, or remove the "
                     "file", subject="results")


def _read(path: Path, mark: str) -> list[dict[str, Any]]:
    """The entries of an existing file after checking its header against `mark`; a torn last line is cut
    off the file."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    # Every line is written whole and ends in a newline; a last piece without one (or one that does not
    # parse) is a write cut short by a kill. Its shape was not finished, so it is dropped, and cut from
    # the file so that the next line appended starts on a line of its own.
    complete, torn = lines[:-1], lines[-1]
    header = _parse(complete[0]) if complete else None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _refuse(path, "is not a zbsearch whole-run results file (its first line is not a header)")
    if header.get("version") != VERSION:
        raise _refuse(path, f"has format version {header.get('version')!r}, not {VERSION}")
    if header.get("fingerprint") != mark:
        raise _refuse(path, "was written by a search with other arguments (model, cluster, space, seeds or "
                            "limits)")
    entries = [_parse(line) for line in complete[1:]]
    if entries and entries[-1] is None:  # a torn line whose newline reached the disk before its text
        entries.pop()
        complete.pop()
        torn = b"x"
    bad = [i + 2 for i, entry in enumerate(entries) if not isinstance(entry, dict)]
    if bad:
        raise _refuse(path, f"has a damaged line {bad[0]} before its last")
    if torn:
        _cut_after(path, sum(len(line) + 1 for line in complete))
    return [entry for entry in entries if isinstance(entry, dict)]


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _cut_after(path: Path, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)
        fh.flush()
        os.fsync(fh.fileno())
