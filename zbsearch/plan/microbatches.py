"""The smallest microbatch count that brings a schedule's bubble fraction below a target.

With a closed form the bubble does not depend on m, so the answer solves bubble / (m T + bubble) <
target. Without one, the simulator times m = 2p, 4p and 8p; past the fill the bubble is affine in m,
the fit predicts the m, and simulations confirm it. Conventions as in zbsearch.plan.closed_forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..core.errors import PlanError, PreconditionError
from ..core.profile import MAX_MICROBATCHES, Profile
from ..schedules.spec import PassTimes, close
from .closed_forms import (CLOSED_FORM, SIMULATOR, Estimate, bubble_form, check_objective, chunks_per_rank,
    closed_form, next_valid_m, previous_valid_m, profile_for, simulated, spec)

# The target search simulates an m only up to this many passes, and checks a prediction with at most
# VERIFY_STEPS simulations; past either, it reports the m its fit predicts as extrapolated.
SIMULATION_BUDGET = 12_000
VERIFY_STEPS = 6


def below(fraction: float, target: float) -> bool:
    """True when `fraction` is below `target`; a fraction equal to it (up to rounding) is not.

    >>> below(0.1, 0.1), below(0.0999, 0.1)
    (False, True)
    """
    return fraction < target and not close(fraction, target)


def check_target(target: float) -> float:
    """A bubble target must be a fraction strictly between 0 and 1."""
    if not isinstance(target, (int, float)) or not 0 < target < 1 or math.isnan(target):
        raise PlanError(f"bubble target {target} is not a fraction in (0, 1): write e.g. 0.05 for 5%",
                        subject="target_bubble")
    return float(target)


@dataclass(frozen=True)
class TargetM:
    """The smallest m that brings the bubble fraction below a target, and how it was found."""

    m: int | None           # None: unreachable (see note)
    source: str             # CLOSED_FORM, SIMULATOR, or "simulator (extrapolated)"
    note: str = ""
    # Set when m is None because the imbalance between stages (1 - mean rank work / the busiest rank's)
    # is at or above the target: no schedule and no m goes below it, only another split of the layers.
    imbalance_floor: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"m": self.m, "source": self.source, "note": self.note, "imbalance_floor": self.imbalance_floor}


def imbalance_bound(imbalance: float, source: str = SIMULATOR) -> TargetM:
    """The answer when the imbalance between stages alone keeps the bubble fraction above the target."""
    return TargetM(None, source, f"the bubble fraction never goes below {imbalance:.4f}, the imbalance between "
                                 "stages (1 - mean rank work / the busiest rank's): no schedule and no microbatch "
                                 "count removes it, only a different split of the layers into stages",
                   imbalance_floor=imbalance)


class _Curve:
    """One schedule's bubble as m varies: the closed form where exact, else the simulator (cached)."""

    def __init__(self, schedule: str, p: int, v: int, objective: str, times: PassTimes | None,
                 profile: Profile | None, budget: int = SIMULATION_BUDGET) -> None:
        self.schedule, self.p, self.v, self.objective, self.budget = schedule, p, v, objective, budget
        self.times = times if times is not None else (PassTimes.of(profile) if profile is not None else PassTimes())
        self._profile = profile
        self._cache: dict[int, Estimate] = {}

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            assert self.times is not None  # without a profile the times are given, or the defaults
            self._profile = profile_for(self.times, self.p, 1)
        return self._profile

    def closed_from(self) -> int | None:
        """The m from which the closed form is exact for every accepted m, or None if it never is."""
        if self.times is None:
            return None
        m_probe = next_valid_m(self.schedule, self.p, 4 * self.p, self.v)  # past every m-condition
        form = bubble_form(self.schedule, self.p, m_probe, self.v, self.times, self.objective)
        if form.failed or form.approximate:
            return None
        return next_valid_m(self.schedule, self.p, form.exact_from_m, self.v)

    def fraction(self, m: int) -> float:
        return self.at(m).bubble_fraction

    def at(self, m: int) -> Estimate:
        if m not in self._cache:
            exact_from = self.closed_from()
            if exact_from is not None and m >= exact_from and self.times is not None:  # (times: else no exact_from)
                self._cache[m] = closed_form(self.schedule, self.p, m, self.times, self.v, self.objective)
            else:
                self._cache[m] = simulated(self.schedule, self.profile, m, self.v, self.objective)
        return self._cache[m]

    def affordable(self, m: int) -> bool:
        exact_from = self.closed_from()
        if exact_from is not None and m >= exact_from:
            return True
        return 3 * self.p * m * chunks_per_rank(self.schedule, self.v) <= self.budget

    def valid(self, m: int) -> int:
        return next_valid_m(self.schedule, self.p, m, self.v)

    def previous(self, m: int) -> int | None:
        return previous_valid_m(self.schedule, self.p, m, self.v)


def _scan_down(curve: _Curve, start: int, target: float) -> int:
    """From an m that meets the target, step down through accepted m while they meet it too."""
    best = start
    m = curve.previous(start)
    while m is not None and curve.affordable(m) and below(curve.fraction(m), target):
        best, m = m, curve.previous(m)
    return best


def _solve_affine(alpha: float, beta: float, work: float, target: float) -> float | None:
    """The m above which (alpha + beta m) / (m work + alpha + beta m) < target; None if never."""
    denominator = target * work - beta * (1 - target)
    if denominator <= 0:
        return None
    return max(0.0, alpha * (1 - target) / denominator)


def _first_below(curve: _Curve, fraction: Callable[[int], float], start: int, bound: float, target: float,
                 max_m: int) -> int | None:
    """The smallest accepted m >= start whose (cheap, falling) `fraction` is below target, starting
    from the real-valued `bound` the formula solves to; the two loops absorb rounding at the boundary."""
    m = curve.valid(max(start, math.floor(bound) + 1))
    while m <= max_m and not below(fraction(m), target):
        m = curve.valid(m + 1)
    if m > max_m:
        return None
    prev = curve.previous(m)
    while prev is not None and prev >= start and below(fraction(prev), target):
        m, prev = prev, curve.previous(prev)
    return m


def _settle(curve: _Curve, m: int, lo: int, target: float, fit: str) -> TargetM:
    """Check a predicted m by simulation (lo is an m known to miss the target): step up while m misses
    it, then down while the m below meets it too, since the bubble wobbles around its affine fit by a
    fraction of a pass. Past VERIFY_STEPS simulations or SIMULATION_BUDGET passes it stops and
    reports the m reached as extrapolated."""
    simulations = 0

    def extrapolated(at: int) -> TargetM:
        return TargetM(at, f"{SIMULATOR} (extrapolated)", f"{fit}; not checked by simulation at m={at}")

    while True:                                   # up until m meets the target
        if not curve.affordable(m) or simulations >= VERIFY_STEPS:
            return extrapolated(m)
        simulations += 1
        if below(curve.fraction(m), target):
            break
        m = curve.valid(m + 1)
    while True:                                   # down while the m below meets it too
        prev = curve.previous(m)
        if prev is None or prev <= lo:
            return TargetM(m, SIMULATOR)
        if simulations >= VERIFY_STEPS:
            return extrapolated(m)
        simulations += 1
        if not below(curve.fraction(prev), target):
            return TargetM(m, SIMULATOR)
        m = prev


def _closed_search(curve: _Curve, start: int, target: float, max_m: int) -> TargetM:
    """Closed form from `start` on: the bubble b does not depend on m, so m > b(1-t)/(t T)."""
    first = curve.at(start)
    if below(first.bubble_fraction, target):
        # The closed form meets it at its first exact m; smaller m need the simulator.
        best = _scan_down(curve, start, target)
        return TargetM(best, CLOSED_FORM if best == start else SIMULATOR)
    bound = _solve_affine(first.bubble, 0.0, first.ideal / start, target)
    m = None if bound is None else _first_below(curve, curve.fraction, start, bound, target, max_m)
    if m is None:
        return TargetM(None, CLOSED_FORM, f"needs more than {max_m} microbatches")
    return TargetM(m, CLOSED_FORM)


def _simulated_search(curve: _Curve, target: float, max_m: int) -> TargetM:
    """Simulator only. Past the fill (m >= 2p) the bubble is affine in m, bubble = a + b m (b > 0 when
    the steady state is bound by comm round trips or by a block that assumes equal passes), so
    simulations at m = 2p, 4p and 8p fix it and check it; the m it predicts is then exact. When the
    three disagree, the prediction is checked by simulation and narrowed by bisection. Assumes the
    fraction falls as m grows (true whenever a > 0)."""
    m_a = curve.valid(2 * curve.p)
    m_b = curve.valid(2 * m_a)
    m_c = curve.valid(2 * m_b)
    e_a = curve.at(m_a)
    if below(e_a.bubble_fraction, target):
        return TargetM(_scan_down(curve, m_a, target), SIMULATOR)
    if not below(e_a.imbalance, target):
        return imbalance_bound(e_a.imbalance)
    e_b, e_c = curve.at(m_b), curve.at(m_c)
    work = e_c.ideal / m_c
    slope_ab = (e_b.bubble - e_a.bubble) / (m_b - m_a)
    beta = max(0.0, (e_c.bubble - e_b.bubble) / (m_c - m_b))
    alpha = e_c.bubble - beta * m_c
    fit = f"bubble = {alpha:.6g} + {beta:.6g} m from simulations at m={m_a}, {m_b}, {m_c}"
    bound = _solve_affine(alpha, beta, work, target)
    if bound is None:
        of_it = f" ({e_c.imbalance:.4f} of it the imbalance between stages)" if e_c.imbalance > 0 else ""
        return TargetM(None, SIMULATOR, f"the bubble grows with m ({fit}); the fraction tends to "
                                        f"{beta / (work + beta):.4f}{of_it}, never below {target:g}")
    if math.isclose(slope_ab, beta, rel_tol=1e-6, abs_tol=1e-9):
        def model(m: int) -> float:
            bubble = alpha + beta * m
            return bubble / (m * work + bubble)
        m = _first_below(curve, model, m_a + 1, bound, target, max_m)
        if m is None:
            return TargetM(None, SIMULATOR, f"needs more than {max_m} microbatches ({fit})")
        return _settle(curve, m, m_a, target, fit)
    # Not affine yet: check the prediction by simulation and bisect.
    lo, hi = m_a, None            # lo fails; hi meets
    m = curve.valid(max(m_a + 1, math.floor(bound) + 1))
    while hi is None:
        if m > max_m:
            return TargetM(None, SIMULATOR, f"needs more than {max_m} microbatches")
        if not curve.affordable(m):
            return TargetM(m, f"{SIMULATOR} (extrapolated)", f"{fit}; simulated up to m={lo}")
        if below(curve.fraction(m), target):
            hi = m
        else:
            lo, m = m, curve.valid(2 * m)
    while True:                    # bisect over accepted m in (lo, hi]
        prev = curve.previous(hi)
        if prev is None or prev <= lo:
            return TargetM(hi, SIMULATOR)
        mid = min(prev, curve.valid((lo + hi) // 2 + 1))
        if below(curve.fraction(mid), target):
            hi = mid
        else:
            lo = mid


def microbatches_for_target(schedule: str, p: int, target: float, v: int = 1, *,
                            times: PassTimes | None = None, profile: Profile | None = None,
                            objective: str = "makespan", max_m: int = MAX_MICROBATCHES,
                            budget: int = SIMULATION_BUDGET) -> TargetM:
    """The smallest accepted m whose bubble fraction is below `target`, and how it was found.

    Uses the closed form wherever it is exact (solving bubble / (m T + bubble) < target for m) and the
    simulator elsewhere (below the closed form's smallest m, or for profiles and times it does not
    cover). Respects the schedule's rule on m (a multiple of p for interleaved, even and >= 2p for
    DualPipe, >= 2p for DualPipeV). `times` defaults to the profile's, else F = B = W = 1, comm 0.
    Simulations stop at `budget` passes (about 3 p m chunks); an m past it is reported as
    extrapolated from an affine fit of the bubble (exact on average, off by a few m at most).

    Returns
    -------
    TargetM
        m None when no m up to `max_m` gets there (e.g. a comm-bound 1F1B whose fraction levels off);
        `imbalance_floor` set when the imbalance between stages is already at or above the target.

    Raises
    ------
    PlanError
        target outside (0, 1).
    PreconditionError
        The schedule is not defined for p ranks.
    """
    check_target(target)
    check_objective(objective)
    need = spec(schedule).ranks_rule(p)
    if need:
        raise PreconditionError(f"{schedule} needs {need}; got p={p}")
    if profile is not None and profile.num_stages != p:
        raise PreconditionError(f"profile {profile.name!r} has {profile.num_stages} stages, not p={p}")
    curve = _Curve(schedule, p, v, objective, times, profile, budget)
    start = curve.closed_from()
    if start is not None:
        return _closed_search(curve, start, target, max_m)
    return _simulated_search(curve, target, max_m)


def min_microbatches(schedule: str, p: int, target: float, v: int = 1, **kwargs: Any) -> int | None:
    """The smallest m whose bubble fraction (bubble / (ideal + bubble)) is below `target`.

    Keyword arguments as `microbatches_for_target` (times, profile, objective, max_m); None when no m
    reaches it. For 1F1B, (p-1)/(m+p-1) < target: p = 8, target 0.1 gives 64 (63 gives exactly 0.1).

    Examples
    --------
    >>> min_microbatches("1f1b", 8, 0.1)
    64
    """
    return microbatches_for_target(schedule, p, target, v, **kwargs).m


__all__ = ["SIMULATION_BUDGET", "TargetM", "VERIFY_STEPS", "below", "check_target", "imbalance_bound",
           "microbatches_for_target", "min_microbatches"]
