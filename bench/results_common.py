"""What every section of make_results.py shares: where results go, how files are written and logged,
and the paper's number style."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from zbsearch.studies import compare as cmp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
PROFILES = ROOT / "profiles"
CITATION = "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024, arXiv:2401.10241"
OBJECTIVES = ("makespan", "span")
DEFAULT_TIME_LIMIT = 20.0

pct = cmp.pct


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def command(section: str, args: argparse.Namespace) -> str:
    """The command that regenerates a section, as every file it writes quotes it."""
    extra = f" --time-limit {args.time_limit:g}" if args.time_limit != DEFAULT_TIME_LIMIT else ""
    return f"python bench/make_results.py --only {section}{extra}"


def write_text(path: Path, text: str) -> None:
    from zbsearch.core.fileio import write_atomic

    write_atomic(path, text)
    log(f"wrote {path.relative_to(ROOT)}")


def write_csv(path: Path, cmd: str, records: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """CSV with the regenerating command as a leading '#' comment line (pandas: comment='#')."""
    write_text(path, f"# Regenerate: {cmd}\n{cmp.records_to_csv(records, columns)}")


def read_csv(path: Path) -> list[dict[str, str]]:
    """The records of a CSV write_csv wrote (its '#' comment lines skipped), as strings."""
    import csv

    return list(csv.DictReader(ln for ln in path.read_text().splitlines() if not ln.startswith("#")))


def rate4(x: float) -> str:
    """The paper's style: .1585."""
    return f"{x:.4f}".replace("0.", ".", 1) if x >= 0 else f"-{-x:.4f}".replace("0.", ".", 1)


def signed4(x: float) -> str:
    return ("+" if x >= 0 else "-") + f"{abs(x):.4f}".replace("0.", ".", 1)


def save_figure(fig: Any, stem: Path) -> None:
    """A drawn matplotlib figure as PNG and as SVG beside each other."""
    for ext in ("png", "svg"):
        fig.savefig(stem.with_suffix(f".{ext}"))
        log(f"wrote {stem.with_suffix(f'.{ext}').name}")


def figures(path_stem: Path, draw: Callable[[Path], Any]) -> None:
    """Draw one figure as PNG and as SVG."""
    for fmt in ("png", "svg"):
        path = path_stem.with_name(f"{path_stem.name}.{fmt}")
        draw(path)
        log(f"wrote {path.relative_to(ROOT)}")


def anomalies(rows: Sequence[cmp.Row]) -> list[str]:
    """A section listing the solved rows that a fixed schedule on the same placement beat within the
    same limit (see compare.note_if_beaten); none when there are none."""
    beaten = [r for r in rows if r.beaten_by is not None]
    if not beaten:
        return []
    return (["## Solved rows a fixed schedule beat", "",
             "A fixed schedule on the same placement fits the same limit at a lower cost than zbsearch's answer "
             "(zbsearch starts from the handcrafted schedules of its placement, so for those this is unexpected):",
             ""]
            + [f"- {r.schedule} at {r.mem_limit}, {r.objective}, m={r.microbatches}: {r.note}" for r in beaten] + [""])
