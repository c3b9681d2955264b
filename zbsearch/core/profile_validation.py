"""Check a profile's JSON against the published JSON Schema (profile.schema.json), then the rules the
schema cannot state, and say what is wrong in one line that names the field and the fix.

The schema is the one source of truth for field names, types and ranges; this module only translates
its verdicts into sentences. By hand, because JSON Schema cannot compare two fields or tell a NaN from a
number: every number is finite, the stages list has num_stages entries, a comm list has num_stages - 1
entries, and every stage's mem_W <= mem_B (after the defaults).
"""

from __future__ import annotations

import difflib
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from .errors import ProfileError

PROFILE_SCHEMA_PATH = Path(__file__).with_name("profile.schema.json")

_SOURCE_FIX = ("say where the numbers come from: measured (with device, date), published (with citation) "
               "or estimated (with method)")
_COMM_FIX = "give one number >= 0 for every boundary, or a list of num_stages - 1 numbers >= 0"
# Profiles the schema accepted, by repr (which tells a list from a tuple and 1 from 1.0 and True): the
# planner builds the same few uniform profiles for many microbatch counts.
_ACCEPTED: set[str] = set()
_ACCEPTED_MAX = 4096
_TYPE_WORDS = {"number": "a number", "integer": "an integer", "string": "a string", "object": "an object",
               "array": "a list", "null": "null"}


def profile_schema() -> dict[str, Any]:
    """The published JSON Schema of the profile format."""
    return json.loads(PROFILE_SCHEMA_PATH.read_text())


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    base = jsonschema.Draft202012Validator
    # JSON Schema counts 4.0 as an integer; a microbatch count of 4.0 is a typo we refuse, as before.
    strict_int = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(base, type_checker=strict_int)(profile_schema())


def where(path: Iterable[Any]) -> str:
    """A field's name as messages write it.

    >>> where(["stages", 0, "F"])
    'stages[0].F'
    >>> where(["source", "kind"])
    'source.kind'
    """
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def fault(origin: str, field: str, problem: str, fix: str) -> ProfileError:
    return ProfileError(f"{origin}: field {field} {problem}; {fix}")


def check_profile_data(data: Any, origin: str) -> None:
    """Raise ProfileError (one line: origin, field, fault, fix) unless `data` is a valid profile."""
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: a profile must be a JSON object (see zbsearch's profile schema)")
    _check_finite(data, origin)
    compact, first_of = _distinct_entries(data)
    key = repr(compact)
    if key not in _ACCEPTED:
        errors = [(_original_path(e, first_of), e) for e in _validator().iter_errors(compact)]
        if errors:
            path, error = min(errors, key=lambda pe: _error_order(pe[1], pe[0]))
            raise ProfileError(_describe(error, path, origin))
        if len(_ACCEPTED) < _ACCEPTED_MAX:
            _ACCEPTED.add(key)
    _check_counts(data, origin)


def _distinct_entries(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """`data` with each of stages and chunks listing its distinct entries once, and for each list the
    original index of every kept entry.

    Most profiles repeat one stage p times, and checking a stage costs the schema library about a
    quarter of a millisecond: a 1,024-stage uniform profile is checked as fast as a one-stage one. Counts are unchanged for the schema's bounds (at least one entry, at
    most maxItems), so a list longer than that is checked whole.
    """
    limit = _schema_bounds()
    compact, first_of = dict(data), {}
    for listed in ("stages", "chunks"):
        entries = data.get(listed)
        if not isinstance(entries, list) or len(entries) > limit.get(listed, len(entries)):
            continue
        seen: dict[str, int] = {}
        for i, entry in enumerate(entries):
            seen.setdefault(repr(entry), i)
        first_of[listed] = list(seen.values())
        compact[listed] = [entries[i] for i in first_of[listed]]
    return compact, first_of


@lru_cache(maxsize=1)
def _schema_bounds() -> dict[str, int]:
    """The schema's maxItems of each list of stage objects (no entry: no bound)."""
    properties = profile_schema()["properties"]
    return {key: properties[key]["maxItems"] for key in ("stages", "chunks") if "maxItems" in properties[key]}


def _original_path(error: Any, first_of: dict[str, list[int]]) -> list[Any]:
    path = list(error.absolute_path)
    if len(path) >= 2 and path[0] in first_of and isinstance(path[1], int):
        path[1] = first_of[path[0]][path[1]]
    return path


def check_memory_order(origin: str, field: str, mem_B: float, mem_W: float) -> None:
    """The third rule the schema cannot state: a stage never holds more after its B than before it."""
    if mem_W > mem_B:
        raise fault(origin, f"{field}.mem_W", f"({mem_W}) exceeds mem_B ({mem_B})",
                    "B frees mem_B - mem_W and W frees mem_W, so mem_W must be <= mem_B")


def check_overlap(origin: str, field: str, F: float, full_backward: float, overlap: float | None) -> None:
    """A fourth: an overlapped F&B pair takes at least its longer pass and at most the two in a row."""
    if overlap is not None and not max(F, full_backward) * (1 - 1e-12) <= overlap <= (F + full_backward) * (1 + 1e-12):
        raise fault(origin, f"{field}.overlap_f_b", f"({overlap}) is outside [{max(F, full_backward)}, {F + full_backward}]",
                    "an overlapped pair takes at least max(F, full backward) and at most F + full backward")


def _numbers(data: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    for key in ("num_stages", "microbatches", "device_capacity_bytes"):
        yield key, data.get(key)
    comm = data.get("comm")
    for i, c in enumerate(comm if isinstance(comm, list) else []):
        yield f"comm[{i}]", c
    if not isinstance(comm, list):
        yield "comm", comm
    yield "link_bandwidth", data.get("link_bandwidth")
    yield "action_overhead", data.get("action_overhead")
    table = data.get("comm_table")
    for i, point in enumerate(table if isinstance(table, list) else []):
        for key, value in (point.items() if isinstance(point, dict) else ()):
            yield f"comm_table[{i}].{key}", value
    for listed in ("stages", "chunks", "layers"):
        entries = data.get(listed)
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            for key, value in (entry.items() if isinstance(entry, dict) else ()):
                yield f"{listed}[{i}].{key}", value
            options = entry.get("recompute") if isinstance(entry, dict) else None
            for k, option in enumerate(options if isinstance(options, list) else []):
                for key, value in (option.items() if isinstance(option, dict) else ()):
                    yield f"{listed}[{i}].recompute[{k}].{key}", value


def _check_finite(data: dict[str, Any], origin: str) -> None:
    for field, value in _numbers(data):
        if isinstance(value, float) and not math.isfinite(value):
            raise fault(origin, field, f"is {value!r}", "give a finite number (no NaN, no infinity, no string)")


def _check_counts(data: dict[str, Any], origin: str) -> None:
    p = len(data["stages"])
    if data.get("num_stages", p) != p:
        raise fault(origin, "stages", f"has {p} entries but num_stages is {data['num_stages']}",
                    "give one entry per stage")
    comm = data.get("comm")
    if isinstance(comm, list) and len(comm) != p - 1:
        raise fault(origin, "comm", f"has {len(comm)} entries for {p} stages",
                    f"give one number per boundary ({p - 1}) or a single number")


def _error_order(error: Any, path: list[Any]) -> tuple[Any, ...]:
    # A misspelt key explains the errors it causes (a required field "missing"), so it comes first;
    # then the earliest field in the document.
    return (error.validator != "additionalProperties", [(1, k) if isinstance(k, str) else (0, k) for k in path],
            str(error.validator))


def _describe(error: Any, path: list[Any], origin: str) -> str:
    value, keyword, rule = error.instance, error.validator, error.validator_value
    if keyword == "additionalProperties":
        return _unknown_key(origin, path, value, error.schema.get("properties", {}))
    if keyword == "required":
        missing = next(k for k in rule if k not in value)
        return str(fault(origin, where(path + [missing]), "is missing", _missing_fix(missing, value)))
    if keyword == "not":
        return str(fault(origin, where(path + ["B"]), "and W are both 0", "a stage needs some backward time"))
    return str(fault(origin, where(path) or "(the whole profile)", _shown(keyword, value), _fix(error)))


def _unknown_key(origin: str, path: list[Any], value: dict[str, Any], known: dict[str, Any]) -> str:
    key = sorted(k for k in value if k not in known)[0]
    inside = f" in {where(path)}" if path else ""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(known))}"
    return f"{origin}: unknown key {key!r}{inside} ({hint}); correct its spelling or remove it"


def _missing_fix(key: str, parent: dict[str, Any]) -> str:
    if key in ("mem_B", "mem_W"):
        return "a profile in bytes must give every stage's mem_B and mem_W"
    if key in ("device", "date", "citation", "method"):
        kind = parent.get("kind")
        return f"{'an' if kind == 'estimated' else 'a'} {kind} profile must state its {key}"
    if key in ("source", "kind"):
        return _SOURCE_FIX
    if key == "stages":
        return "list one object per stage with F, B, W, mem_B, mem_W"
    return "give a number"


def _shown(keyword: str, value: Any) -> str:
    if keyword in ("minItems", "maxItems") and isinstance(value, list):
        return "is empty" if not value else f"has {len(value)} entries"
    return f"is {value!r}"


def _fix(error: Any) -> str:
    keyword, rule, schema = error.validator, error.validator_value, error.schema
    if keyword == "oneOf":
        return _COMM_FIX
    if keyword == "enum":
        return _SOURCE_FIX if list(error.absolute_path) == ["source", "kind"] else f"use one of {rule}"
    if keyword == "const":
        return f"this zbsearch reads {rule!r}"
    if "minimum" in schema and "maximum" in schema:
        return f"it must be an integer from {schema['minimum']} to {schema['maximum']}"
    if keyword == "type":
        kinds = [rule] if isinstance(rule, str) else list(rule)
        words = " or ".join(_TYPE_WORDS[k] for k in kinds if k != "null")
        return f"give {words}" + (" or leave it out" if "null" in kinds else "")
    if keyword in ("minimum", "exclusiveMinimum", "maximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<="}[keyword]
        return f"it must be {op} {rule}"
    if keyword == "minItems" and list(error.absolute_path) == ["stages"]:
        return "list one object per stage with F, B, W, mem_B, mem_W"
    if keyword == "minItems":
        return f"give at least {rule} {'entry' if rule == 1 else 'entries'}"
    if keyword == "maxItems":
        return f"give at most {rule} entries"
    return f"it does not match the profile schema ({keyword})"
