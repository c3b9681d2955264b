"""Small pieces the generators share."""

from __future__ import annotations

from ..core.errors import PreconditionError


def require(condition: bool, schedule: str, need: str, p: int, m: int) -> None:
    """Raise a PreconditionError that says what the schedule needs, e.g. 'm >= 2p'."""
    if not condition:
        raise PreconditionError(f"{schedule} needs {need}; got p={p}, m={m}")
