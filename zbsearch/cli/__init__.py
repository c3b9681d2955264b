"""The command line: a thin typer layer over the library (see docs/architecture.md)."""

from .app import app, main

__all__ = ["app", "main"]
