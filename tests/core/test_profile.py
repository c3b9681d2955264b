"""Profile loading, the --uniform shorthand and the published JSON Schema.

Each bad example is rejected by the loader with a message naming the field; the schema must reject the
same examples, except the few rules JSON Schema cannot express (it cannot compare two fields or count
one list against another number), which the schema's description lists.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest

from zbsearch.core.errors import ProfileError, ZbsearchError
from zbsearch.core.profile import Profile, load_profile, profile_schema, uniform_profile

PROFILES = sorted((Path(__file__).resolve().parents[2] / "profiles").glob("*.json"))


def good() -> dict[str, Any]:
    return {
        "format": "zbsearch-profile/1",
        "name": "test",
        "num_stages": 2,
        "microbatches": 4,
        "time_unit": "ms",
        "memory_unit": "relative",
        "stages": [
            {"F": 1.0, "B": 1.0, "W": 0.5, "mem_B": 1.0, "mem_W": 0.5},
            {"F": 1.0, "B": 1.0, "W": 0.5, "mem_B": 1.0, "mem_W": 0.5},
        ],
        "comm": [0.1],
        "source": {"kind": "estimated", "method": "made up for a test"},
    }


def good_bytes() -> dict[str, Any]:
    data = good()
    data.update(memory_unit="bytes", device_capacity_bytes=80 * 2**30)
    for s in data["stages"]:
        s.update(mem_B=2 * 2**30, mem_W=2**30, static_bytes=10 * 2**30, full_backward=1.4)
    data["source"] = {"kind": "measured", "device": "H100", "date": "2024-05-01"}
    return data


def mutate(fn: Callable[[dict[str, Any]], None], base: Callable[[], dict[str, Any]] = good) -> dict[str, Any]:
    data = copy.deepcopy(base())
    fn(data)
    return data


def stage0(**kv: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["stages"][0].update(kv)


def drop(*path: Any) -> Callable[[dict[str, Any]], None]:
    def fn(d: dict[str, Any]) -> None:
        for key in path[:-1]:
            d = d[key]
        del d[path[-1]]
    return fn


def setv(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.__setitem__(key, value)


# (id, data, text the loader's message must contain, schema can check it)
BAD: list[tuple[str, dict[str, Any], str, bool]] = [
    ("missing F", mutate(drop("stages", 0, "F")), "stages[0].F", True),
    ("zero F", mutate(stage0(F=0)), "stages[0].F", True),
    ("negative B", mutate(stage0(B=-1.0)), "stages[0].B", True),
    ("NaN W as a string", mutate(stage0(W="NaN")), "stages[0].W", True),
    ("B and W both 0", mutate(stage0(B=0, W=0)), "stages[0].B", True),
    ("boolean F", mutate(stage0(F=True)), "stages[0].F", True),
    ("unknown stage field", mutate(stage0(Fwd=1.0)), "unknown key 'Fwd' in stages[0] (known keys: B, F, W, full_backward", True),
    ("unknown chunk field", mutate(setv("chunks", [{"F": 1, "B": 1, "W": 1, "memB": 1}])),
     "unknown key 'memB' in chunks[0] (did you mean 'mem_B'?)", True),
    ("misspelt microbatches", mutate(setv("microbatchs", 32)), "unknown key 'microbatchs' (did you mean 'microbatches'?)",
     True),
    ("misspelt comm", mutate(setv("comms", 0.5)), "unknown key 'comms' (did you mean 'comm'?)", True),
    ("unknown key far from any", mutate(setv("zzz", 1)), "unknown key 'zzz' (known keys: action_overhead, chunks, comm, comm_table, details", True),
    ("mem_B zero", mutate(stage0(mem_B=0)), "stages[0].mem_B", True),
    ("mem_W > mem_B", mutate(stage0(mem_W=2.0)), "stages[0].mem_W", False),
    ("bytes profile without mem_W", mutate(drop("stages", 1, "mem_W"), good_bytes), "stages[1].mem_W", True),
    ("wrong comm length", mutate(setv("comm", [0.1, 0.1])), "comm", False),
    ("negative comm", mutate(setv("comm", -1)), "comm", True),
    ("string comm", mutate(setv("comm", "fast")), "comm", True),
    ("missing source", mutate(drop("source")), "field source is missing", True),
    ("unknown source kind", mutate(setv("source", {"kind": "guessed"})), "source.kind", True),
    ("measured without device", mutate(setv("source", {"kind": "measured", "date": "2024-01-01"})), "source.device", True),
    ("measured without date", mutate(setv("source", {"kind": "measured", "device": "H100"})), "source.date", True),
    ("published without citation", mutate(setv("source", {"kind": "published"})), "source.citation", True),
    ("estimated without method", mutate(setv("source", {"kind": "estimated"})), "source.method", True),
    ("empty stages", mutate(setv("stages", [])), "stages", True),
    ("num_stages 0", mutate(setv("num_stages", 0)), "num_stages", True),
    ("num_stages mismatch", mutate(setv("num_stages", 3)), "stages", False),
    ("microbatches 0", mutate(setv("microbatches", 0)), "microbatches", True),
    ("microbatches fractional", mutate(setv("microbatches", 2.5)), "microbatches", True),
    ("microbatches a float", mutate(setv("microbatches", 4.0)), "field microbatches is 4.0", False),
    ("too many stages", mutate(lambda d: d.update(stages=d["stages"] * 513, num_stages=1026)),
     "field num_stages is 1026", True),
    ("too many stages without num_stages", mutate(lambda d: (d.update(stages=d["stages"] * 513), d.pop("num_stages"))),
     "field stages has 1026 entries; give at most 1024 entries", True),
    ("memory unit", mutate(setv("memory_unit", "GiB")), "memory_unit", True),
    ("format", mutate(setv("format", "zbsearch-profile/2")), "format", True),
    ("name not a string", mutate(setv("name", 3)), "name", True),
    ("capacity zero", mutate(setv("device_capacity_bytes", 0)), "device_capacity_bytes", True),
    ("chunks not a list", mutate(setv("chunks", {"F": 1})), "chunks", True),
    ("details not an object", mutate(setv("details", [1])), "details", True),
]


# -- the loader -------------------------------------------------------------------------------

@pytest.mark.parametrize("base", [good, good_bytes])
def test_good_profiles_load(base):
    prof = Profile.from_dict(base())
    assert prof.num_stages == 2 and prof.microbatches == 4
    assert prof.comm == (0.1,)


def test_defaults_of_a_minimal_profile():
    prof = Profile.from_dict({"stages": [{"F": 2, "B": 2, "W": 1}], "source": {"kind": "estimated", "method": "x"}})
    assert prof.microbatches == 1 and prof.memory_unit == "relative" and prof.time_unit == "us"
    assert prof.stages[0].mem_B == 1.0 and prof.stages[0].mem_W == 0.5
    assert prof.comm == ()


@pytest.mark.parametrize("name,data,field,_schema", BAD, ids=[b[0] for b in BAD])
def test_loader_rejects_naming_the_field(name, data, field, _schema):
    with pytest.raises(ProfileError) as err:
        Profile.from_dict(data, origin="p.json")
    message = str(err.value)
    assert field in message
    assert "\n" not in message


@pytest.mark.parametrize("data,message", [
    (mutate(setv("microbatchs", 32)),
     "p.json: unknown key 'microbatchs' (did you mean 'microbatches'?); correct its spelling or remove it"),
    (mutate(setv("comms", 0.5)), "p.json: unknown key 'comms' (did you mean 'comm'?); correct its spelling or remove it"),
    (mutate(stage0(F=0)), "p.json: field stages[0].F is 0; it must be > 0"),
    (mutate(setv("microbatches", 2.5)), "p.json: field microbatches is 2.5; it must be an integer from 1 to 100000"),
    (mutate(setv("source", {"kind": "estimated"})),
     "p.json: field source.method is missing; an estimated profile must state its method"),
    (mutate(setv("comm", [0.1, 0.1])),
     "p.json: field comm has 2 entries for 2 stages; give one number per boundary (1) or a single number"),
    (mutate(setv("stages", [])), "p.json: field stages is empty; list one object per stage with F, B, W, mem_B, mem_W"),
    (mutate(stage0(W=math.inf)),
     "p.json: field stages[0].W is inf; give a finite number (no NaN, no infinity, no string)"),
])
def test_messages_name_the_field_and_the_fix(data, message):
    with pytest.raises(ProfileError) as err:
        Profile.from_dict(data, origin="p.json")
    assert str(err.value) == message


def test_a_misspelt_key_is_reported_before_what_it_causes():
    data = mutate(lambda d: d.update(Stages=d.pop("stages")))
    with pytest.raises(ProfileError, match=r"^p\.json: unknown key 'Stages' \(did you mean 'stages'\?\)"):
        Profile.from_dict(data, origin="p.json")


def test_source_stays_open_for_notes():
    prof = Profile.from_dict(mutate(setv("source", {"kind": "published", "citation": "x", "note": "table 3"})))
    assert prof.source == {"kind": "published", "citation": "x", "note": "table 3"}


@pytest.mark.parametrize("bad_at", [0, 1, 3, 5])
def test_repeated_stages_report_the_first_faulty_index(bad_at):
    stages = [{"F": 1.0, "B": 1.0, "W": 0.5}] * 6
    stages = stages[:bad_at] + [{"F": 1.0, "B": -1.0, "W": 0.5}] * (6 - bad_at)
    data = {"stages": stages, "source": {"kind": "estimated", "method": "x"}}
    with pytest.raises(ProfileError, match=rf"field stages\[{bad_at}\]\.B is -1\.0; it must be >= 0$"):
        Profile.from_dict(data, origin="p.json")


def test_file_errors_name_the_path_not_the_internal_name(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(mutate(setv("microbatchs", 32))))
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(err.value).startswith(f"{path}: unknown key 'microbatchs'")
    assert "'test'" not in str(err.value)


def test_a_loaded_profile_knows_its_path_but_equals_the_same_profile_in_memory(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(good()))
    loaded, built = load_profile(path), Profile.from_dict(good())
    assert loaded.path == str(path) and loaded.label == repr(str(path))
    assert built.path is None and built.label == "'test'"
    assert loaded == built and repr(loaded) == repr(built).replace("name='profile'", "name='test'")
    assert "path" not in loaded.to_dict()


def test_nan_token_in_a_file_is_rejected(tmp_path):
    text = json.dumps(good()).replace('"W": 0.5', '"W": NaN', 1)
    assert "NaN" in text
    path = tmp_path / "nan.json"
    path.write_text(text)
    with pytest.raises(ZbsearchError, match="NaN"):
        load_profile(path)


def test_nan_and_infinity_values_are_rejected():
    for bad in (math.nan, math.inf):
        with pytest.raises(ProfileError, match=r"stages\[0\]\.W"):
            Profile.from_dict(mutate(stage0(W=bad)))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ZbsearchError, match="does not exist"):
        load_profile(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ZbsearchError, match="not valid JSON"):
        load_profile(bad)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ProfileError, match="JSON object"):
        load_profile(arr)


def test_round_trip_through_a_file(tmp_path):
    prof = Profile.from_dict(good_bytes())
    path = tmp_path / "p.json"
    prof.save(path)
    assert load_profile(path) == prof


# -- the uniform shorthand --------------------------------------------------------------------

def test_uniform_profile():
    prof = uniform_profile(1, 2, 0.5, p=4, m=8)
    assert prof.num_stages == 4 and prof.microbatches == 8
    assert (prof.stages[0].F, prof.stages[0].B, prof.stages[0].W) == (1.0, 2.0, 0.5)
    assert prof.comm == (0.0, 0.0, 0.0)
    assert prof.source["kind"] == "estimated"

    prof = uniform_profile(1, 1, 1, 0.25, p=3, m=2, mem_B=2, mem_W=0.5)
    assert prof.comm == (0.25, 0.25)
    assert (prof.stages[2].mem_B, prof.stages[2].mem_W) == (2.0, 0.5)


@pytest.mark.parametrize("times,memory,message", [
    ((0, 1, 1), (1, 0.5), "uniform profile: field stages[0].F is 0; it must be > 0"),
    ((1, -1, 1), (1, 0.5), "uniform profile: field stages[0].B is -1; it must be >= 0"),
    ((1, 1, 1, -2), (1, 0.5), "uniform profile: field comm is -2; give one number >= 0 for every boundary, or a "
                              "list of num_stages - 1 numbers >= 0"),
    ((1, 1, 1), (1, 2), "uniform profile: field stages[0].mem_W (2.0) exceeds mem_B (1.0); B frees mem_B - mem_W and "
                        "W frees mem_W, so mem_W must be <= mem_B"),
])
def test_uniform_profile_rejects_bad_costs(times, memory, message):
    with pytest.raises(ProfileError) as info:
        uniform_profile(*times, p=4, m=8, mem_B=memory[0], mem_W=memory[1])
    assert str(info.value) == message


@pytest.mark.parametrize("p,m,match", [(0, 4, "stages p"), (4, 0, "microbatches m"), (-1, 4, "stages p")])
def test_uniform_rejects_bad_sizes(p, m, match):
    with pytest.raises(ProfileError, match=match):
        uniform_profile(1, 1, 1, p=p, m=m)


# -- the JSON Schema --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def validator():
    import jsonschema

    schema = profile_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", PROFILES, ids=[p.name for p in PROFILES])
def test_schema_accepts_shipped_profiles(validator, path):
    data = json.loads(path.read_text())
    assert not list(validator.iter_errors(data)), path
    load_profile(path)  # and the loader agrees


@pytest.mark.parametrize("data", [
    good(), good_bytes(),
    Profile.from_dict(good_bytes()).to_dict(),
    uniform_profile(1, 2, 1, 0.5, p=4, m=8).to_dict(),
    {"stages": [{"F": 2, "B": 2, "W": 1}], "source": {"kind": "estimated", "method": "x"}},
    mutate(setv("comm", 0.5)),
    mutate(lambda d: d.update(chunks=[{"F": 0.5, "B": 0.5, "W": 0.25}] * 4, details={"model": "x"})),
])
def test_schema_accepts_what_the_loader_accepts(validator, data):
    Profile.from_dict(data)
    assert not [e.message for e in validator.iter_errors(data)]


@pytest.mark.parametrize("name,data,field,schema_checks", BAD, ids=[b[0] for b in BAD])
def test_schema_rejects_what_the_loader_rejects(validator, name, data, field, schema_checks):
    """The published schema rejects every bad example except the rules only the loader can check (two
    fields compared, a list counted against a number, 4.0 read as an integer)."""
    assert bool(list(validator.iter_errors(data))) is schema_checks, name


def test_schema_documents_the_loader_only_rules():
    description = profile_schema()["description"]
    for rule in ("num_stages entries", "num_stages - 1", "mem_W <= mem_B"):
        assert rule in description


def test_remembered_verdicts_never_let_a_different_profile_through():
    """The loader remembers what the schema accepted; a list and a tuple, or 1 and True, must not share it."""
    ok = {"stages": [{"F": 1, "B": 1, "W": 1}], "source": {"kind": "estimated", "method": "x"}}
    assert Profile.from_dict(copy.deepcopy(ok)) == Profile.from_dict(copy.deepcopy(ok))
    with pytest.raises(ProfileError, match=r"field stages is \(.*\); give a list$"):
        Profile.from_dict(dict(ok, stages=tuple(ok["stages"])))
    with pytest.raises(ProfileError, match=r"field stages\[0\]\.F is True; give a number$"):
        Profile.from_dict(dict(ok, stages=[{"F": True, "B": 1, "W": 1}]))
