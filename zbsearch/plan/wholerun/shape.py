"""The shape of a run: tensor, pipeline and data-parallel degrees, sharding, microbatch size and count,
expert-parallel degree."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# How the data-parallel ranks share a pipeline rank's static bytes and sync its gradients (docs/whole-run.md).
SHARDINGS = ("ddp", "zero1", "zero2", "fsdp", "fsdp-reshard")


@dataclass(frozen=True, order=True)
class RunShape:
    """t x p x d GPUs; m microbatches of b sequences per pipeline per step (global batch = m b d); `ep`: the
    expert-parallel degree, drawn from the d data-parallel ranks (1 for a dense model)."""

    t: int
    p: int
    d: int
    b: int
    m: int
    sharding: str
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.t * self.p * self.d

    def label(self) -> str:
        """tp8 pp4 dp8 fsdp b1 m16 (ep when above 1)."""
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        return f"tp{self.t} pp{self.p} dp{self.d} {self.sharding} b{self.b} m{self.m}{ep}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunShape":
        return cls(**{k: data[k] for k in ("t", "p", "d", "b", "m", "sharding", "ep")})
