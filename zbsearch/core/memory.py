"""Per-rank activation memory limits from the strings users type.

`2p`, `1p`, `1.5p`: that many times p times the rank's own per-microbatch stage activation memory
(mem_B, as profiled: recompute does not shrink the limit), the Zero Bubble paper's ZB-1p / ZB-2p
convention. `48GiB`, `40GB`, `1e9`: an absolute size in bytes (needs a profile whose memory_unit is
bytes). `auto`: device capacity, less a headroom kept for allocator fragmentation and buffers
(`DEFAULT_HEADROOM`), minus the static bytes the rank holds (twice its stage's on DualPipe's placement,
which keeps two parameter copies). `none`: no limit. Limits count
activations only, the way the paper's limits do, except a size on a profile that is one split of its
layers (`profile.partition`): there the split decides each rank's static bytes, so a size caps the
rank's whole memory, static bytes plus activations (`includes_static`).

A limit remembers the unit it was written in, so that a limit too small for one microbatch is answered
with the minimum in that unit (`4.06 GiB`, `0.25p`), rounded up so that the answer itself fits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from .errors import InfeasibleError, MemoryLimitError
from .ir import Placement, linear
from .profile import Profile
from .stage_cost import StageCost

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# How a unit is written back to the user, whatever case they typed.
_UNIT_NAMES = {"": "bytes", "b": "bytes", "kb": "kB", "mb": "MB", "gb": "GB", "tb": "TB",
               "kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB"}
P_UNIT = "p"
# Share of the device kept free by `auto`: the caching allocator's fragmentation, NCCL and workspace
# buffers are not in the profile, and a plan that fills the device to the byte runs out of memory.
DEFAULT_HEADROOM = 0.08
# A limit may fall short of the need by this much (float noise) and still count as meeting it.
_RTOL = 1e-9
_P_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)?\s*p\s*$", re.I)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:e\d+)?|\.\d+)\s*([kmgt]i?b|b)?\s*$", re.I)


@dataclass(frozen=True)
class MemoryLimit:
    """Activation limit per rank, in the profile's memory unit. `per_rank[r]` is inf for no limit.

    `unit` is how the limit was written: "p" (a multiple of p times each rank's stage mem_B) or a byte
    unit ("GiB", "GB", "MiB", ..., "bytes"); messages about the limit use it.
    """

    text: str
    per_rank: tuple[float, ...]
    unit: str = P_UNIT
    # The limit as written caps static bytes + activations; `per_rank` is what is left for activations.
    includes_static: bool = False

    @property
    def unlimited(self) -> bool:
        return all(math.isinf(x) for x in self.per_rank)

    def in_stage_units(self, profile: Profile) -> tuple[float, ...]:
        """The limit of each rank in multiples of that rank's stage mem_B."""
        return tuple(x / profile.stage_mem_B(r) for r, x in enumerate(self.per_rank))


def size_bytes(text: str) -> tuple[float, str] | None:
    """`48GiB`, `40GB`, `1e9` as (bytes, the unit as written back to the user); None when `text` is no size.

    >>> size_bytes("48GiB"), size_bytes("80 gb"), size_bytes("2p")
    ((51539607552.0, 'GiB'), (80000000000.0, 'GB'), None)
    """
    m = _SIZE_RE.match(text)
    if m is None:
        return None
    unit = (m.group(2) or "").lower()
    return float(m.group(1)) * _UNITS[unit], _UNIT_NAMES[unit]


def no_limit(profile: Profile) -> MemoryLimit:
    return MemoryLimit("none", (math.inf,) * profile.num_stages)


def parse_mem_limit(text: str | None, profile: Profile, placement: Placement | None = None, *,
                    headroom: float = DEFAULT_HEADROOM) -> MemoryLimit:
    """Parse a limit string against a profile; raise MemoryLimitError saying what to write instead.

    `placement` matters to `auto` only: the static bytes it subtracts are those each rank holds under
    it (Profile.static_bytes_per_rank), so DualPipe's placement subtracts both parameter copies.
    Default: one stage per rank. `headroom` is the share of the device `auto` keeps free."""
    if text is None or text.strip().lower() in ("", "none", "inf", "unlimited"):
        return no_limit(profile)
    p = profile.num_stages
    s = text.strip()
    factor = p_multiple(s)
    if factor is not None:
        if factor <= 0:
            raise MemoryLimitError(f"memory limit {text!r} must be positive, e.g. 1p or 2p", subject="mem_limit")
        return MemoryLimit(s, tuple(factor * p * profile.stage_mem_B(r) for r in range(p)), P_UNIT)
    if s.lower() == "auto":
        return _auto(profile, placement if placement is not None else linear(p), headroom)
    sized = size_bytes(s)
    if sized is not None:
        size, unit = sized
        if size <= 0:
            raise MemoryLimitError(f"memory limit {text!r} must be positive", subject="mem_limit")
        if profile.memory_unit != "bytes":
            raise MemoryLimitError(
                f"memory limit {text!r} is an absolute size, but profile {profile.label} gives memory in "
                "relative units: use a multiple of p such as 1p or 2p", subject="mem_limit")
        if profile.partition is not None:
            return MemoryLimit(s, tuple(size - (profile.stages[r].static_bytes or 0.0) for r in range(p)),
                               unit, includes_static=True)
        return MemoryLimit(s, (size,) * p, unit)
    raise MemoryLimitError(
        f"memory limit {text!r} is not understood: use a multiple of p (1p, 2p, 1.5p), a size "
        "(48GiB, 40GB, 1000000000), auto or none", subject="mem_limit")


def _auto(profile: Profile, placement: Placement, headroom: float) -> MemoryLimit:
    """Device capacity, less the headroom, minus the static bytes each rank holds under the placement."""
    static = profile.static_bytes_per_rank(placement)
    if profile.device_capacity_bytes is None or static is None or profile.memory_unit != "bytes":
        raise MemoryLimitError(
            f"memory limit auto needs the profile to give device_capacity_bytes and every stage's "
            f"static_bytes in bytes; profile {profile.label} does not: use e.g. 2p or 48GiB", subject="mem_limit")
    if not 0 <= headroom < 1:
        raise MemoryLimitError(f"headroom {headroom} is not a share of the device: give 0 <= headroom < 1",
                               subject="headroom")
    usable = profile.device_capacity_bytes * (1 - headroom)
    per = tuple(usable - x for x in static)
    if min(per) <= 0:
        r = per.index(min(per))
        copies = placement.param_copies
        held = f"the {copies} parameter copies it holds on placement {placement.name!r}" if copies > 1 else "its static bytes"
        raise MemoryLimitError(
            f"memory limit auto leaves no room on rank {r}: {held} ({_amount(static[r] / 2**30, 'GiB', up=True)}) "
            f"exceed the usable device memory ({_amount(usable / 2**30, 'GiB', up=False)} after a {headroom:.0%} "
            "headroom)", subject="mem_limit")
    return MemoryLimit("auto", per, "GiB", includes_static=profile.partition is not None)


def min_feasible_limit(profile: Profile, placement: Placement) -> tuple[float, ...]:
    """Per rank, the smallest activation limit any schedule can meet.

    Necessary: on each rank a microbatch's forwards all come before its backwards there (the loss is
    at the end of its route), so the mem_B of all the rank's chunks on that route are held at once.
    Enough: run the microbatches one at a time, each W right after its B, or with fused backwards where
    B leaves more held than F (mem_W > mem_B, torch's split backward under the torch-runtime memory
    model: a fused backward frees everything at its end).
    """
    return activation_need([profile.chunk_cost(placement, c) for c in range(placement.num_chunks)], placement)


def activation_need(chunk_costs: Sequence[StageCost], placement: Placement) -> tuple[float, ...]:
    """min_feasible_limit from the chunks' running costs (chunk_costs[c]: chunk c's, as Profile.chunk_cost
    gives it), for a caller that holds them already."""
    need = [0.0] * placement.num_ranks
    for route in placement.routes:
        per = [0.0] * placement.num_ranks
        for c in route:
            per[placement.chunk_to_rank[c]] += chunk_costs[c].mem_B
        need = [max(a, b) for a, b in zip(need, per)]
    return tuple(need)


def short_of(need: Sequence[float], limit: MemoryLimit) -> list[bool]:
    """Per rank, whether `limit` is below `need` (the rank's min_feasible_limit), within round-off."""
    return [cap < n * (1 - _RTOL) for cap, n in zip(limit.per_rank, need)]


def ranks_short(profile: Profile, placement: Placement, limit: MemoryLimit,
                need: Sequence[float] | None = None) -> list[bool]:
    """Per rank, whether `limit` is too small for one microbatch in flight there (`need`: the ranks'
    min_feasible_limit, when already computed)."""
    return short_of(min_feasible_limit(profile, placement) if need is None else need, limit)


def check_feasible(profile: Profile, placement: Placement, limit: MemoryLimit) -> None:
    """Raise InfeasibleError when `limit` cannot hold one microbatch in flight on some rank.

    The message gives the smallest feasible limit in the limit's own unit, rounded up, and the rank
    that needs it: of the ranks the limit is too small for, the one that needs the most. For a limit
    that scales every rank alike (a size, or a multiple of p) that is the rank needing the most of all,
    so raising the limit to the stated minimum fits every rank.
    """
    need = min_feasible_limit(profile, placement)
    short = [r for r, is_short in enumerate(ranks_short(profile, placement, limit, need)) if is_short]
    if not short:
        return
    p = placement.num_ranks
    static = [profile.stages[r].static_bytes or 0.0 if limit.includes_static else 0.0 for r in range(p)]
    unit = [_unit_size(limit.unit, profile, p, r) for r in range(p)]
    needed = [(n + s) / u for n, s, u in zip(need, static, unit)]
    rank = max(short, key=lambda r: needed[r])
    top = max(needed)
    most = "the most of any rank" if needed[rank] >= top * (1 - _RTOL) else f"rank {needed.index(top)} needs the most"
    what = "its static bytes and one microbatch in flight need" if limit.includes_static else \
        "one microbatch in flight needs"
    raise InfeasibleError(
        f"memory limit {limit.text} is infeasible: {what} at least "
        f"{_amount(needed[rank], limit.unit, up=True)} on rank {rank} ({most}), but the limit gives it "
        f"{_amount((limit.per_rank[rank] + static[rank]) / unit[rank], limit.unit, up=False)}; the minimum is "
        f"{_amount(top, limit.unit, up=True)} per rank (the smallest feasible limit): raise the limit to at least that",
        subject="mem_limit")


def _unit_size(unit: str, profile: Profile, p: int, rank: int) -> float:
    """One `unit` on `rank`, in the profile's memory unit."""
    if unit == P_UNIT:
        return p * profile.stage_mem_B(rank)
    return float(_UNITS[next(k for k, name in _UNIT_NAMES.items() if name == unit)])


def _amount(x: float, unit: str, up: bool) -> str:
    """`x` units as a user would write them: 4 significant digits for multiples of p, 3 for sizes,
    whole bytes for plain bytes; rounded up (`up`) when it is a minimum the user will type back.

    >>> _amount(4.0601, "GiB", up=True), _amount(1 / 3, "p", up=True), _amount(1 / 3, "p", up=False)
    ('4.07 GiB', '0.3334p', '0.3333p')
    >>> _amount(3135.2, "MB", up=True), _amount(2**31 + 0.5, "bytes", up=True)
    ('3136 MB', '2147483649 bytes')
    """
    if unit == "bytes":
        return f"{math.ceil(x) if up else round(x)} bytes"
    digits = 4 if unit == P_UNIT else 3
    decimals = max(0, digits - 1 - math.floor(math.log10(x))) if x > 0 else 0
    if up:
        x = math.ceil(x * 10**decimals * (1 - _RTOL)) / 10**decimals
    # Fixed point, not %g: "3140 MB" can be typed back, "3.14e+03 MB" cannot.
    text = f"{x:.{decimals}f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return f"{text}p" if unit == P_UNIT else f"{text} {unit}"


def p_multiple(text: str | None) -> float | None:
    """N of a limit written as a multiple of p (`2p`, `1.5p`, `p`), else None.

    >>> p_multiple("1.5p"), p_multiple("p"), p_multiple("48GiB")
    (1.5, 1.0, None)
    """
    m = _P_RE.match(text or "")
    if not m:
        return None
    return float(m.group(1)) if m.group(1) else 1.0


def above_usable(text: str | None, profile: Profile, headroom: float = DEFAULT_HEADROOM) -> str | None:
    """Why an explicit size lets some rank plan for more than the device holds less the headroom `auto`
    keeps free (the allocator's and the runtime's own buffers), or None: a size as written is taken at
    its word, so `80gb` on an 80 GiB device plans to the last byte less 6%. On a profile that lists its
    layers a size is the whole rank (static bytes and activations); otherwise it is the activations,
    and the rank's static bytes come on top.

    >>> from zbsearch.core.profile import uniform_profile
    >>> from dataclasses import replace
    >>> prof = replace(uniform_profile(1, 1, 1, p=2, m=4), memory_unit="bytes", device_capacity_bytes=80 * 2**30)
    >>> above_usable("70GiB", prof) is None, above_usable("80gb", prof) is not None
    (True, True)
    """
    m = _SIZE_RE.match((text or "").strip().lower())
    if not m or profile.device_capacity_bytes is None or profile.memory_unit != "bytes":
        return None
    size = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    static = 0.0 if profile.layers is not None else max((s.static_bytes or 0.0 for s in profile.stages), default=0.0)
    usable = profile.device_capacity_bytes * (1 - headroom)
    if size + static <= usable * (1 + _RTOL):
        return None
    gib = 2**30
    whole = "a rank's whole memory" if profile.layers is not None else \
        f"activations on top of up to {static / gib:.3g} GiB of static bytes"
    return (f"memory limit {text} ({size / gib:.3g} GiB, {whole}) is above what the device holds less its "
            f"{headroom:.0%} headroom ({usable / gib:.3g} GiB of {profile.device_capacity_bytes / gib:.3g} GiB): "
            f"a plan that fills it may not run; use auto, or a size of at most {(usable - static) / gib:.3g} GiB")


def byte_cap(text: str | None, profile: Profile, headroom: float = DEFAULT_HEADROOM) -> float | None:
    """The whole-rank byte cap (static bytes + activations) a limit gives on any split of the profile's
    layers: the size as written, or the usable device memory for `auto`; None for multiples of p
    (which scale with each split's own activations) and for no limit.

    >>> from zbsearch.core.profile import uniform_profile
    >>> byte_cap("2p", uniform_profile(1, 1, 1, p=2, m=4)) is None
    True
    """
    t = (text or "none").strip().lower()
    if t in ("", "none", "inf", "unlimited") or _P_RE.match(t):
        return None
    if t == "auto":
        parse_mem_limit(text, profile, headroom=headroom)  # the same checks and messages as the limit itself
        assert profile.device_capacity_bytes is not None
        return profile.device_capacity_bytes * (1 - headroom)
    m = _SIZE_RE.match(t)
    if m and profile.memory_unit == "bytes":
        return float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    parse_mem_limit(text, profile)  # raises the limit's own error
    return None
