"""fileio: whole-or-nothing writes (fsynced before the rename), their mode, and one-line read errors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from zbsearch.core import fileio
from zbsearch.core.errors import FileError, ZbsearchError
from zbsearch.core.fileio import finite, read_json, read_text, write_atomic


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("content,expected", [
    ("héllo\nworld\n", "héllo\nworld\n".encode()),
    (b"\x00\xffraw", b"\x00\xffraw"),
    ("", b""),
])
def test_writes_exactly_the_content(tmp_path: Path, content, expected: bytes) -> None:
    path = tmp_path / "out.txt"
    write_atomic(path, content)
    assert path.read_bytes() == expected
    assert leftovers(tmp_path) == []


def test_replaces_an_existing_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old " * 1000)
    write_atomic(str(path), "new")
    assert path.read_text() == "new"


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_mode_is_what_a_plain_open_gives(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "f", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == mode


def test_data_is_fsynced_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        # A regular file is the temporary file; a folder is the rename's parent.
        calls.append(("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file", None))
        real_fsync(fd)

    def replace(src, dst) -> None:
        calls.append(("replace", Path(src).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "fsync", fsync)
    monkeypatch.setattr(fileio.os, "replace", replace)
    write_atomic(tmp_path / "f", "payload")
    assert calls == [("fsync-file", None), ("replace", b"payload"), ("fsync-dir", None)]


@pytest.mark.parametrize("failing", ["fsync", "replace", "chmod"])
def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        failing: str) -> None:
    path = tmp_path / "out.json"
    path.write_text("old")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new content")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert leftovers(tmp_path) == []


def test_a_failure_before_the_first_write_creates_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fileio.os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "new.txt", "x")
    assert list(tmp_path.iterdir()) == []


def test_missing_folder_is_a_file_error(tmp_path: Path) -> None:
    with pytest.raises(FileError, match=r"folder .*nope does not exist \(create it first\)"):
        write_atomic(tmp_path / "nope" / "f.txt", "x")


def test_reads_give_one_line_file_errors(tmp_path: Path) -> None:
    with pytest.raises(FileError, match=r"^profile file .*missing\.json does not exist$"):
        read_text(tmp_path / "missing.json", "profile")
    bad = tmp_path / "bad.json"
    for text in ("{ not json", '{"x": NaN}', '{"x": -Infinity}'):
        bad.write_text(text)
        with pytest.raises(FileError, match="^schedule file .*bad.json is not valid JSON") as err:
            read_json(bad, "schedule")
        assert "\n" not in str(err.value)
    assert issubclass(FileError, ZbsearchError)
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2.5]}')
    assert read_json(good, "x") == {"a": [1, 2.5]}


def test_a_folder_is_not_a_readable_file(tmp_path: Path) -> None:
    with pytest.raises(FileError, match="cannot read profile file"):
        read_text(tmp_path, "profile")


@pytest.mark.parametrize("value,ok", [
    (1, True), (0.0, True), (-2.5, True), (float("nan"), False), (float("inf"), False),
    (True, False), ("1", False), (None, False),
])
def test_finite(value, ok: bool) -> None:
    assert finite(value) is ok
