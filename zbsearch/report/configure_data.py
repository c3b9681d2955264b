"""What the whole-run page (configure_html.py) shows, as plain JSON-ready data: every solved shape once
(the scatter's marks and the ranked table's rows), the pruned shapes apart at the most their bound allows,
the refused and failed shapes with their reasons, and the certificate.

It reads the table a whole-run search hands back, `Outcome.table()` of zbsearch.plan.wholerun (what
`zbsearch configure --json` prints: `chosen`, `ranked`, `pruned`, `refused`, `failed`, `certificate`,
`fixed`), not the plan layer's records: the report layer sits below the plan layer. Times there are in
microseconds, memory in bytes; here seconds and GiB, to 6 significant digits (the page shows fewer).

A pruned shape was never solved: it has a lower bound on its step and nothing else. It is drawn at the
throughput that bound allows (tokens per GPU per step / bound), the most any plan of it could reach, and
apart from the solved shapes, since its memory was never computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, TypeGuard

GIB = 2.0**30
Table = Mapping[str, Any]


@dataclass(frozen=True)
class RunFacts:
    """What the run trains on what: the page's title, and the tokens a step spreads over the GPUs (what a
    pruned shape's bound is turned into a throughput with)."""

    model: str
    global_batch: int
    seq: int
    gpus: int
    gpu: str

    @property
    def tokens_per_gpu_step(self) -> float:
        return self.global_batch * self.seq / self.gpus


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.6g}")


def shape_label(shape: Mapping[str, Any]) -> str:
    """A shape's label, as RunShape.label() writes it.

    >>> shape_label({"t": 8, "p": 4, "d": 2, "b": 1, "m": 16, "sharding": "fsdp", "ep": 1})
    'tp8 pp4 dp2 fsdp b1 m16'
    """
    ep = f" ep{shape['ep']}" if shape.get("ep", 1) > 1 else ""
    return f"tp{shape['t']} pp{shape['p']} dp{shape['d']} {shape['sharding']} b{shape['b']} m{shape['m']}{ep}"


def _is_plan(result: Any) -> TypeGuard[Mapping[str, Any]]:
    """A solved shape with a step (a ShapeResult's JSON: not a refusal, a failure or None)."""
    return isinstance(result, Mapping) and result.get("status") == "solved" and result.get("timing") is not None


def solved(table: Table) -> list[Mapping[str, Any]]:
    """Every solved shape once, fastest first: the ranked ones, and the user's configuration where it was
    solved but not ranked (its bound was no better than the chosen plan's step)."""
    out = [r for r in table.get("ranked") or () if _is_plan(r)]
    fixed = table.get("fixed")
    if _is_plan(fixed) and all(r["shape"] != fixed["shape"] for r in out):
        out.append(fixed)
    return sorted(out, key=lambda r: r["timing"]["step_us"])  # stable: the search's order among ties


def _gap(result: Mapping[str, Any]) -> float | None:
    bound, step = result.get("step_bound_us") or 0.0, result["timing"]["step_us"]
    return None if bound <= 0 else step / bound - 1


def shape_point(result: Mapping[str, Any], chosen: Mapping[str, Any] | None,
                fixed: Mapping[str, Any] | None) -> dict[str, Any]:
    """One solved shape: its shape, plan and figures (seconds, tokens/s/GPU, shares, GiB), and whether it is
    the chosen plan or the user's configuration."""
    s = result["shape"]
    peak = max(result.get("peak_bytes") or (), default=None)
    cap = result.get("capacity_bytes")
    return {
        "label": shape_label(s), **{k: s[k] for k in ("t", "p", "d", "sharding", "b", "m", "ep")},
        "placement": result.get("placement"), "schedule": result.get("schedule_name"),
        "step_s": _num(result["timing"]["step_us"] / 1e6),
        "bound_s": _num((result.get("step_bound_us") or 0.0) / 1e6) or None,
        "tps": _num(result.get("tokens_per_s_per_gpu")), "mfu": _num(result.get("mfu")),
        "bubble": _num(result.get("bubble_fraction")),
        "peak_gib": None if peak is None else _num(peak / GIB), "cap_gib": None if cap is None else _num(cap / GIB),
        "gap": _num(_gap(result)),
        "chosen": int(chosen is not None and s == chosen.get("shape")),
        "fixed": int(fixed is not None and s == fixed.get("shape")),
    }


def pruned_points(table: Table, facts: RunFacts, skip: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The pruned shapes with a positive bound, less those in `skip` (labels of shapes solved after all:
    the user's configuration is solved even where pruned), each with its step bound in seconds and the
    throughput it allows, the most any plan of it could reach."""
    left = set(skip)
    out = []
    for p in table.get("pruned") or ():
        label = p.get("label") or shape_label(p["shape"])
        if label in left or not (p.get("bound") or 0.0) > 0:
            continue
        seconds = p["bound"] / 1e6
        out.append({"label": label, "p": p["shape"]["p"], "bound_s": _num(seconds),
                    "tps_bound": _num(facts.tokens_per_gpu_step / seconds), "reason": p.get("reason", "")})
    return out


def not_solved(table: Table) -> list[tuple[str, str, str]]:
    """(shape or group of shapes, fate, reason) of every shape without a plan: refused before or by its
    solve, and failed."""
    rows = [(r["what"], "refused", r["reason"]) for r in table.get("refused") or ()]
    rows += [(r.get("label") or shape_label(r["shape"]), r.get("status", "failed"), r.get("reason") or "")
             for r in table.get("ranked") or () if not _is_plan(r)]
    rows += [(f.get("label") or shape_label(f["shape"]), "failed", f["failed"]) for f in table.get("failed") or ()]
    return rows


def fixed_line(table: Table) -> str | None:
    """The user's configuration against the chosen plan, in one sentence; None where none was given."""
    fixed, chosen = table.get("fixed"), table.get("chosen")
    if fixed is None:
        return None
    if not _is_plan(fixed):
        what = fixed.get("what") or fixed.get("label") or shape_label(fixed["shape"])
        return f"Your configuration {what}: {fixed.get('reason') or fixed.get('failed')}"
    label, step = shape_label(fixed["shape"]), fixed["timing"]["step_us"]
    if not _is_plan(chosen):
        return f"Your configuration {label}: step {step / 1e6:.4g} s."
    faster = step / chosen["timing"]["step_us"] - 1
    same = fixed["shape"] == chosen["shape"]
    return (f"Your configuration {label}: step {step / 1e6:.4g} s; " +
            ("it is the chosen plan." if same else f"the chosen plan is {faster:.1%} faster."))


def run_data(table: Table, facts: RunFacts, plan: bool = False) -> dict[str, Any]:
    """Everything the page's scatter script draws: the solved shapes, the pruned ones apart, the GPU's
    memory, the chosen shape, the certificate; `plan`: whether the page also holds the chosen plan's
    sections (their script then marks the page ready)."""
    chosen, fixed = table.get("chosen"), table.get("fixed")
    shapes = [shape_point(r, chosen, fixed if _is_plan(fixed) else None) for r in solved(table)]
    caps = [s["cap_gib"] for s in shapes if s["cap_gib"] is not None]
    certificate = table.get("certificate")
    return {
        "shapes": shapes, "pruned": pruned_points(table, facts, [s["label"] for s in shapes]),
        "cap_gib": max(caps, default=None),
        "chosen": shape_label(chosen["shape"]) if _is_plan(chosen) else None,
        "certificate": certificate["sentence"] if certificate else None, "plan": plan,
    }
