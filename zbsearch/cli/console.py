"""Where the CLI writes: answers on stdout, errors and progress on stderr.

Text is printed literally (rich markup off): schedule names, paths and library messages can hold
brackets such as `zbsearch[torch]`, which markup would swallow. Colour comes only from styles the
CLI sets itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

# progress(done, total, what is running now); total None while it is not known yet.
ProgressCallback = Callable[[int, Optional[int], str], None]


# Width of tables written to a pipe or a file (rich would take 80 columns there, and fold layer names in
# the split table a letter per line); a terminal, or COLUMNS, sets its own.
PIPE_WIDTH = 160


def stdout_console() -> Console:
    """The console commands print their answer on: no markup, no highlighting, no wrapping."""
    console = Console(highlight=False, soft_wrap=True, markup=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def print_error(message: str) -> None:
    """One line on stderr: 'error: <message>', the prefix in red when stderr is a terminal."""
    _print_prefixed("error:", "bold red", message)


def print_warning(message: str) -> None:
    """One line on stderr: 'warning: <message>', the prefix in yellow when stderr is a terminal; the
    command goes on."""
    _print_prefixed("warning:", "bold yellow", message)


def _print_prefixed(prefix: str, style: str, message: str) -> None:
    line = Text.assemble((prefix, style), " ", " ".join(message.split()))
    Console(stderr=True, highlight=False, soft_wrap=True).print(line)


@contextmanager
def progress_bar(title: str, *, enabled: bool = True, console: Console | None = None) -> Iterator[ProgressCallback]:
    """A transient progress bar on stderr (or `console`); yields the callback that moves it.

    The bar shows `title`, the bar, done/total, the elapsed time and the callback's label, literally.
    It draws only when `enabled` and the console is a terminal, so scripts and pipes see nothing of it.
    """
    console = console if console is not None else Console(stderr=True)
    bar = Progress(
        TextColumn(f"[bold]{escape(title)}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}", markup=False),
        console=console, transient=True, disable=not (enabled and console.is_terminal),
    )
    with bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int | None, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        yield update
