"""Library errors speak in domain terms; only the CLI names command-line flags (issue #11, item 5).

The library (everything outside zbsearch/cli) is also called from Python, where `--mem-limit` means
nothing; the CLI puts the flag of the error's subject in front of the message (cli/options.py:
SUBJECT_FLAGS). Provenance text that a profile records (e.g. "forced by --layers-per-stage") is not an
error and is not scanned.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import zbsearch

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
PACKAGE = Path(zbsearch.__file__).parent


def flags_in_raises(source: str) -> list[tuple[int, str]]:
    """(line, flag) for every string constant or f-string part inside a `raise` that names a flag."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found += [(node.lineno, flag) for flag in FLAG.findall(part.value)]
    return sorted(found)


def test_the_scan_finds_flags_in_plain_and_formatted_messages():
    source = '''
def f(x):
    if x:
        raise ValueError(f"--mem-limit {x!r} is not a limit")
    raise ValueError("memory limit " + repr(x) + ": use " + "--uniform F,B,W")
note = "forced by --layers-per-stage"
'''
    assert flags_in_raises(source) == [(4, "--mem-limit"), (5, "--uniform")]
    assert flags_in_raises('raise ValueError(f"memory limit {x!r}: use a multiple of p, e.g. 2p - 1p")') == []


def test_library_errors_name_no_command_line_flag():
    library = [path for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "cli"]
    assert len(library) > 20  # the scan really reads the package
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}: {flag}"
                 for path in library for line, flag in flags_in_raises(path.read_text())]
    assert offenders == []
