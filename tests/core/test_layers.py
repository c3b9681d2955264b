"""Layer-level profiles and one split of their layers over a placement (core/layers.py, core/partition.py)."""

from __future__ import annotations

import json
import math

import pytest

from zbsearch.core.errors import PartitionError, ProfileError
from zbsearch.core.ir import dualpipe, interleaved, linear, vshape
from zbsearch.core.memory import check_feasible, parse_mem_limit
from zbsearch.core.errors import InfeasibleError
from zbsearch.core.partition import counts_of, partition_profile
from zbsearch.core.profile import Profile

GiB = 2**30


def layer(name: str, F: float, *, kind: str = "decoder", mem: float = 1.0 * GiB, static: float = 2.0 * GiB,
          out: float = 1e6, **extra) -> dict:
    return {"name": name, "kind": kind, "F": F, "B": F, "W": F, "mem_B": mem, "mem_W": mem / 2,
            "static_bytes": static, "out_bytes": out, **extra}


def layered(n_blocks: int = 6, *, bandwidth: float | None = 1e3, **top) -> dict:
    layers = [layer("tok_embeddings", 0.5, kind="embedding", mem=1e3, static=4 * GiB)]
    layers += [layer(f"layers.{i}", 10.0 + i) for i in range(n_blocks)]
    layers.append(layer("output", 25.0, kind="output", modules=["norm", "output"], static=4 * GiB, out=4))
    data = {"name": "toy", "num_stages": 2, "microbatches": 4, "memory_unit": "bytes", "time_unit": "us",
            "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB / 2}] * 2, "comm": 7.0,
            "device_capacity_bytes": 80.0 * GiB, "layers": layers,
            "source": {"kind": "estimated", "method": "hand-made for tests"}, **top}
    if bandwidth is not None:
        data["link_bandwidth"] = bandwidth
    return data


def test_layers_round_trip_through_json():
    prof = Profile.from_dict(layered())
    again = Profile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert again.layers == prof.layers
    assert prof.layers[-1].module_paths == ("norm", "output")
    assert prof.layers[1].module_paths == ("layers.0",)
    assert again.link_bandwidth == 1e3


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(layers=[]), "field layers is empty"),
    (lambda d: d["layers"][2].update(F=0), "field layers[2].F is 0; it must be > 0"),
    (lambda d: d["layers"][2].update(B=-1.0), "field layers[2].B is -1.0; it must be >= 0"),
    (lambda d: d["layers"][2].update(W=math.nan), "field layers[2].W is nan; give a finite number"),
    (lambda d: d["layers"][3].update(name="layers.0"), "layers[3] names 'layers.0', already named by layers[1]"),
    (lambda d: d["layers"][3].update(modules=["output"]), "layers[7] names 'output', already named by layers[3]"),
    (lambda d: d["layers"][2].update(mem_W=5 * GiB), "field layers[2].mem_W"),
    (lambda d: d["layers"][2].update(kind="block"), "field layers[2].kind"),
    (lambda d: d["layers"][2].update(flops=3), "unknown key 'flops' in layers[2]"),
])
def test_bad_layers_are_one_line_errors_naming_the_field(mutate, message):
    data = layered()
    mutate(data)
    with pytest.raises(ProfileError) as err:
        Profile.from_dict(data, origin="toy.json")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_linear_split_sums_its_layers_and_pays_the_hop_from_out_bytes():
    prof = partition_profile(Profile.from_dict(layered()), linear(2), [3, 5])
    assert prof.partition == (("tok_embeddings", "layers.0", "layers.1"),
                              ("layers.2", "layers.3", "layers.4", "layers.5", "output"))
    assert prof.stages[0].F == pytest.approx(0.5 + 10 + 11)
    assert prof.stages[1].F == pytest.approx(12 + 13 + 14 + 15 + 25)
    assert prof.stages[0].static_bytes == 8 * GiB and prof.stages[1].static_bytes == 12 * GiB
    assert prof.comm == (1e6 / 1e3,)  # layers.1's output over the link
    assert prof.chunks == prof.stages


def test_a_v_split_puts_the_embedding_and_the_head_on_rank_0():
    prof = partition_profile(Profile.from_dict(layered()), vshape(2), [2, 2, 2, 2])
    assert prof.partition[0][0] == "tok_embeddings" and prof.partition[3][-1] == "output"
    assert prof.stages[0].F == pytest.approx(0.5 + 10 + 15 + 25)  # chunks 0 and 3
    assert prof.stages[0].static_bytes == 4 * GiB + 2 * GiB + 2 * GiB + 4 * GiB
    assert prof.chunk_cost(vshape(2), 3).F == pytest.approx(15 + 25)


def test_dualpipe_copies_pay_static_bytes_twice():
    prof = partition_profile(Profile.from_dict(layered()), dualpipe(2), [4, 4])
    one = partition_profile(Profile.from_dict(layered()), linear(2), [4, 4])
    assert prof.stages[0].static_bytes == one.stages[0].static_bytes + one.stages[1].static_bytes


def test_without_a_bandwidth_a_uniform_comm_carries_over_to_any_stage_count():
    prof = partition_profile(Profile.from_dict(layered(bandwidth=None)), interleaved(4, 2), [1] * 8)
    assert prof.comm == (7.0, 7.0, 7.0)


@pytest.mark.parametrize("counts,message", [
    ([3, 4], "add up to 7 but the model has 8 layers .*: make them add up to 8"),
    ([2, 2, 4], "give 3 chunks but placement 'linear' on 2 ranks has 2: give 2 counts in route order"),
    ([0, 8], "every chunk needs a positive whole number of layers"),
])
def test_bad_splits_say_what_to_give(counts, message):
    with pytest.raises(PartitionError, match=message):
        partition_profile(Profile.from_dict(layered()), linear(2), counts)


def test_more_chunks_than_layers_is_refused():
    with pytest.raises(PartitionError, match="the model has 8 layers but placement 'v' on 8 ranks has 16 chunks"):
        partition_profile(Profile.from_dict(layered()), vshape(8), [1] * 16)


def test_a_byte_cap_on_a_split_caps_static_plus_activations():
    prof = partition_profile(Profile.from_dict(layered()), linear(2), [3, 5])
    limit = parse_mem_limit("20GiB", prof)
    assert limit.includes_static and limit.per_rank == (12 * GiB, 8 * GiB)
    with pytest.raises(InfeasibleError, match=r"its static bytes and one microbatch in flight need at least 17 GiB "
                       r"on rank 1 \(the most of any rank\), but the limit gives it 13 GiB"):
        check_feasible(prof, linear(2), parse_mem_limit("13GiB", prof))


def test_a_saved_split_is_read_back_by_names():
    prof = Profile.from_dict(layered())
    split = partition_profile(prof, vshape(2), [2, 3, 2, 1])
    assert counts_of(split.partition, prof.layers, vshape(2)) == (2, 3, 2, 1)
    wrong = list(split.partition)
    wrong[0], wrong[1] = wrong[1], wrong[0]
    with pytest.raises(PartitionError, match="use the profile the split was made for"):
        counts_of(wrong, prof.layers, vshape(2))


@pytest.mark.parametrize("key", ["mem_B", "mem_W", "static_bytes"])
def test_a_field_one_layer_misses_while_others_give_it_is_missing(key: str) -> None:
    # issue 29, defect 3: a missing static_bytes counted as 0 under a whole-memory cap, silently, and a
    # missing mem_B surfaced as "mem_W (...) exceeds mem_B (0.0)".
    import copy
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[2] / "profiles" / "h100.json").read_text())
    broken = copy.deepcopy(data)
    del broken["layers"][3][key]
    with pytest.raises(ProfileError, match=rf"field layers\[3\]\.{key} is missing, while layers\[0\] gives it"):
        Profile.from_dict(broken)
    for layer in data["layers"]:  # given by none: allowed (a profile of times only)
        layer.pop(key, None)
    if key != "mem_B":  # mem_W alone would exceed a mem_B of 0
        Profile.from_dict(data)
