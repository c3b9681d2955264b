"""What a run reports per pass (interop/run/result.py): one typed row per rank, chunk and kind, written to
JSON as the rows `zbsearch run --json` always wrote."""

from __future__ import annotations

from zbsearch.interop.run.result import PassTimes, _passes
from zbsearch.schedules import generate
from zbsearch.core.profile import uniform_profile
from zbsearch.sim.simulate import chunk_costs


def test_a_row_without_a_profile_writes_no_profile_figures() -> None:
    assert PassTimes(0, 1, "F", 4, 0.5).to_dict() == {"rank": 0, "chunk": 1, "kind": "F", "count": 4, "mean_s": 0.5}
    row = PassTimes(1, 0, "I", 2, 0.25, 3.0, None).to_dict()
    assert row["profile"] == 3.0 and "profile_s" in row and row["profile_s"] is None


def test_rows_carry_the_profiles_mean_time_in_seconds() -> None:
    schedule = generate("zb-h1", 2, 4)
    costs = chunk_costs(schedule, uniform_profile(1.0, 2.0, 1.0, p=2, m=4))
    measured = {c: {"F": [0.1] * 4, "I": [0.2] * 4, "W": [0.1] * 4} for c in range(2)}
    rows = _passes(schedule, measured, costs, 0.5)
    assert {(r.rank, r.chunk, r.kind) for r in rows} == {(r, r, k) for r in range(2) for k in ("F", "I", "W")}
    input_grad = next(r for r in rows if r.kind == "I")
    assert (input_grad.count, input_grad.profile, input_grad.profile_s) == (4, 2.0, 1.0)
    assert [r.profile for r in _passes(schedule, measured, None, None)] == [None] * 6
