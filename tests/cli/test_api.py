"""The top-level API as docs/architecture.md documents it: the example there runs as written, and every
name in `zbsearch.__all__` resolves (the search's lazily, without importing OR-Tools up front)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import zbsearch

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def test_every_exported_name_resolves() -> None:
    missing = [name for name in zbsearch.__all__ if not hasattr(zbsearch, name)]
    assert missing == []
    assert set(zbsearch.__all__) <= set(dir(zbsearch))


def test_import_does_not_load_ortools() -> None:
    code = "import sys, zbsearch; print('ortools' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_the_documented_example_runs(tmp_path: Path, monkeypatch) -> None:
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, "docs/architecture.md lost its API example"
    code = block.group(1).replace('"profiles/', f'"{ROOT}/profiles/').replace("time_limit=30", "time_limit=5")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOC), "exec"), {})
    assert (tmp_path / "schedule.csv").read_text().startswith("0F0")


def test_the_documented_names_are_the_exported_ones() -> None:
    table = DOC.read_text().split("| name | what |")[1].split("\n\n")[0]
    documented = set(re.findall(r"`(\w+)`", table))
    subclasses = {name for name in zbsearch.__all__ if name.endswith("Error") and name != "ZbsearchError"}
    assert documented == set(zbsearch.__all__) - subclasses


def test_python_dash_m_runs_the_cli() -> None:
    # Launchers that start a module (torchrun -m, srun python -m) reach the same CLI.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "zbsearch", "list"], capture_output=True, text=True, check=True)
    assert "zb-h1" in out.stdout and "1f1b" in out.stdout
