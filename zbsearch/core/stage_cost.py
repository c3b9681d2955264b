"""One stage's (or one chunk's) cost for one microbatch: the record every step reads, on its own so that
the profile and the calibration that adjusts it (core/calibration.py) both import it without a circle."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .ir import Kind


@dataclass(frozen=True)
class StageCost:
    """Cost of one stage (or one chunk) for one microbatch."""

    F: float
    B: float
    W: float
    mem_B: float = 1.0
    mem_W: float = 0.5
    full_backward: float | None = None
    static_bytes: float | None = None
    overlap_f_b: float | None = None   # an overlapped F&B pair: a forward and a full backward together
    # What torch's runtime holds from F until I and from I until W (core/calibration.py); None: not measured.
    mem_B_torch: float | None = None
    mem_W_torch: float | None = None
    # On the chunk that computes the loss, what stays after W until the iteration ends (torch keeps every
    # microbatch's loss, and with it the part of its graph W does not free); None: not measured.
    mem_kept_torch: float | None = None
    # Resolved by the memory model (calibration.running_cost): held after W until the iteration ends.
    mem_kept: float | None = None
    # On a chunk with recomputed layers (core/recompute/levels.py): its cost for a microbatch that keeps its
    # activations, i.e. its layers as profiled, so that a plan may recompute only some microbatches. None
    # when nothing on the chunk is recomputed. Never written.
    without_recompute: "StageCost | None" = None

    def for_microbatch(self, recomputes: bool) -> "StageCost":
        """The cost of one microbatch that recomputes (this cost) or keeps its activations."""
        return self if recomputes or self.without_recompute is None else self.without_recompute

    @property
    def BW(self) -> float:
        """Time of the fused backward: the profile's own figure, else B + W."""
        return self.full_backward if self.full_backward is not None else self.B + self.W

    def time_of(self, kind: Kind) -> float:
        """One pass's time: F, B (torch's I), W or the fused backward (BW)."""
        if kind is Kind.F:
            return self.F
        if kind is Kind.B:
            return self.B
        if kind is Kind.W:
            return self.W
        if kind is Kind.FULL_B:
            return self.BW
        raise KeyError(kind)

    @property
    def overlap_ratio(self) -> float:
        """What a pass costs inside an overlapped F&B pair, as a share of its own time: the profile's
        pair time over F + full backward; 1 (no saving) when the profile does not give it."""
        return 1.0 if self.overlap_f_b is None else self.overlap_f_b / (self.F + self.BW)

    def scaled(self, share: float) -> "StageCost":
        def part(x: float | None) -> float | None:
            return None if x is None else x * share

        return StageCost(
            self.F * share, self.B * share, self.W * share, self.mem_B * share, self.mem_W * share,
            part(self.full_backward), part(self.static_bytes), part(self.overlap_f_b),
            part(self.mem_B_torch), part(self.mem_W_torch), part(self.mem_kept_torch), part(self.mem_kept),
            None if self.without_recompute is None else self.without_recompute.scaled(share),
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and k not in ("mem_kept", "without_recompute")}
