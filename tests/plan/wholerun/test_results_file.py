"""The append-only results file: round trip, a torn last line, another search's file, no partial header."""

from __future__ import annotations

import json
import os

import pytest

from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun import results_file
from zbsearch.plan.wholerun.results_file import ResultsFile, fingerprint

ARGS = {"workload": {"layers": 8, "batch": 32}, "cluster": {"gpus": 16}, "seed": 0, "limit": 30.0}


def test_round_trip(tmp_path):
    path = tmp_path / "results.jsonl"
    new = ResultsFile.open(path, ARGS)
    assert new.finished == []
    header = json.loads(path.read_text().splitlines()[0])
    assert header["fingerprint"] == fingerprint(ARGS) and header["version"] == results_file.VERSION
    entries = [{"kind": "bound", "shape": {"t": 1}, "record": {"bound": 1.5}},
               {"kind": "result", "shape": {"t": 1}, "failed": "no schedule fits"}]
    for entry in entries:
        new.append(entry)
    again = ResultsFile.open(path, dict(reversed(list(ARGS.items()))))  # key order does not matter
    assert again.finished == entries


def test_a_torn_last_line_is_dropped_and_cut_off(tmp_path):
    path = tmp_path / "results.jsonl"
    file = ResultsFile.open(path, ARGS)
    file.append({"kind": "bound", "n": 1})
    with open(path, "a") as fh:
        fh.write('{"kind": "bound", "n": ')  # a kill in the middle of a write
    reopened = ResultsFile.open(path, ARGS)
    assert reopened.finished == [{"kind": "bound", "n": 1}]
    reopened.append({"kind": "bound", "n": 2})
    assert ResultsFile.open(path, ARGS).finished == [{"kind": "bound", "n": 1}, {"kind": "bound", "n": 2}]


def test_a_torn_line_whose_newline_landed_is_dropped_too(tmp_path):
    path = tmp_path / "results.jsonl"
    ResultsFile.open(path, ARGS).append({"n": 1})
    with open(path, "ab") as fh:
        fh.write(b'{"n": \x00\x00\n')
    assert ResultsFile.open(path, ARGS).finished == [{"n": 1}]
    assert path.read_text().count("\n") == 2


def test_a_file_of_other_arguments_is_refused_in_one_line(tmp_path):
    path = tmp_path / "results.jsonl"
    ResultsFile.open(path, ARGS).append({"n": 1})
    before = path.read_bytes()
    with pytest.raises(PlanError) as caught:
        ResultsFile.open(path, {**ARGS, "seed": 1})
    assert caught.value.subject == "results"
    assert str(caught.value) == (f"results file {path} was written by a search with other arguments (model, "
                                 "cluster, space, seeds or limits): give another path for this search's results, "
                                 "or remove the file")
    assert path.read_bytes() == before  # never mixed in, never touched


@pytest.mark.parametrize("text, why", [
    ("not json\n", "is not a zbsearch whole-run results file (its first line is not a header)"),
    ('{"format": "zbsearch-wholerun-results", "version": 99, "fingerprint": "x"}\n', "has format version 99, not 1"),
])
def test_other_files_are_refused(tmp_path, text, why):
    path = tmp_path / "results.jsonl"
    path.write_text(text)
    with pytest.raises(PlanError, match="^results file .* " + why.replace("(", r"\(").replace(")", r"\)")):
        ResultsFile.open(path, ARGS)


def test_a_damaged_line_before_the_last_is_refused(tmp_path):
    path = tmp_path / "results.jsonl"
    ResultsFile.open(path, ARGS).append({"n": 1})
    with open(path, "a") as fh:
        fh.write("garbage\n{\"n\": 2}\n")
    with pytest.raises(PlanError, match="has a damaged line 3 before its last"):
        ResultsFile.open(path, ARGS)


def test_the_header_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"

    def crash(fd, *args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)  # the header's temporary file fails before its rename
    with pytest.raises(OSError):
        ResultsFile.open(path, ARGS)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    ResultsFile.open(path, ARGS)
    assert path.read_text().count("\n") == 1


def test_an_empty_file_gets_a_header(tmp_path):
    path = tmp_path / "results.jsonl"
    path.touch()
    assert ResultsFile.open(path, ARGS).finished == []
    assert json.loads(path.read_text())["fingerprint"] == fingerprint(ARGS)
