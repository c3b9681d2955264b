"""Static bytes under data-parallel sharding (issue 28, deliverable 1): the bytes per parameter each
sharding keeps, a profile rescaled layer by layer with FSDP's gather buffer per chunk, and the refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import ProfileError
from zbsearch.core.ir import vshape
from zbsearch.core.partition import partition_profile
from zbsearch.core.profile import load_profile
from zbsearch.core.sharding import Sharding, param_bytes
from zbsearch.core.static_bytes import shard_profile
from zbsearch.profiling.build import profile_estimate
from zbsearch.profiling.request import LlamaShape, PipelineSetup, StageSplit

runner = CliRunner()


@pytest.fixture(scope="module")
def llama():
    """6 blocks estimated on an H100 in bf16 with Adam: 16 bytes per parameter unsharded."""
    return profile_estimate(LlamaShape(layers=6, hidden=512, heads=8, kv_heads=2, seq=256, vocab=4096), "h100",
                            StageSplit(stages=2), PipelineSetup(microbatches=4))


@pytest.mark.parametrize("how, keep, gathered", [("zero1", 2 + 2 + 12 / 8, 0.0), ("zero2", 2 + 14 / 8, 0.0),
                                                 ("fsdp", 16 / 8, 4.0), ("fsdp-whole-grads", 2 + 14 / 8, 2.0)])
def test_bytes_per_parameter_follow_zero(how, keep, gathered) -> None:
    parts = param_bytes(2, "adam")
    assert (parts.weights, parts.grads, parts.master, parts.state) == (2, 2, 4, 8)
    assert Sharding(8, how).per_param(parts) == pytest.approx(keep)
    assert Sharding(8, how).gathered_per_param(parts) == gathered
    assert Sharding(1, how).per_param(parts) == 16


def test_sharding_divides_the_static_bytes_a_layer_states_not_its_params(llama) -> None:
    # A profile scaled by hand (tensor parallelism emulated: every byte / 8) keeps its params as counted;
    # sharding must divide the bytes the layers state (issue 38: 65.7 against 4.6 GiB per rank).
    scaled = replace(llama, layers=tuple(replace(x, static_bytes=x.static_bytes / 8) for x in llama.layers))
    sharded = shard_profile(scaled, Sharding(4))
    for before, after in zip(scaled.layers, sharded.layers):
        assert after.static_bytes == pytest.approx(before.static_bytes / 4)
        assert after.params == before.params


def test_fsdp_divides_every_layer_and_adds_the_largest_gather_per_stage(llama) -> None:
    sharded = shard_profile(llama, Sharding(4))
    for before, after in zip(llama.layers, sharded.layers):
        assert after.static_bytes == pytest.approx(before.params * 16 / 4)
        assert after.gather_bytes == pytest.approx(before.params * 4)
        assert replace(after, static_bytes=before.static_bytes, gather_bytes=0.0) == before  # nothing else moved
    names = llama.details["partition"]["layers_per_stage"]
    by_name = {layer.name: layer for layer in sharded.layers}
    for stage, stage_names in zip(sharded.stages, names):
        group = [by_name[n] for n in stage_names]
        assert stage.static_bytes == pytest.approx(sum(x.static_bytes for x in group) + max(x.gather_bytes
                                                                                             for x in group))
    assert sharded.details["static"]["sharding"]["what"].startswith("sharded over 4 data-parallel ranks (FSDP")
    # A chunk of a new split gathers its own largest layer.
    chunk = partition_profile(sharded, vshape(2), [2, 2, 2, 2]).chunks[3]
    assert chunk.static_bytes == pytest.approx(sum(x.static_bytes for x in sharded.layers[6:8])
                                               + max(x.gather_bytes for x in sharded.layers[6:8]))


def test_a_sharded_profile_round_trips_through_its_file(llama, tmp_path: Path) -> None:
    sharded = shard_profile(llama, Sharding(8, "zero2"))
    sharded.save(tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again.layers == sharded.layers and again.stages == sharded.stages
    assert all(layer.gather_bytes == 0 for layer in again.layers)  # zero2 gathers nothing


def test_sharding_refuses_what_it_cannot_do(llama) -> None:
    assert shard_profile(llama, Sharding(1)) is llama
    with pytest.raises(ProfileError, match="is sharded over 4 data-parallel ranks .* already: shard the unsharded"):
        shard_profile(shard_profile(llama, Sharding(4)), Sharding(2))
    bare = replace(llama, details={k: v for k, v in llama.details.items() if k != "dtype"})
    with pytest.raises(ProfileError, match=r"does not record its weights' dtype and optimizer \(fields details.dtype"):
        shard_profile(bare, Sharding(2))
    with pytest.raises(ProfileError, match="lists no layers"):
        shard_profile(replace(llama, layers=None), Sharding(2))
    for degree in (0, -1, 2.5, True):
        with pytest.raises(ProfileError, match="data-parallel shard degree .* is out of range"):
            Sharding(degree).check()


def test_the_command_line_shards_estimates_and_solves(tmp_path: Path) -> None:
    estimate = ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "4", "--hidden", "256",
                "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "2", "-m", "4"]
    result = runner.invoke(app, [*estimate, "-o", str(tmp_path / "full.json")])
    assert result.exit_code == 0, result.stderr
    result = runner.invoke(app, [*estimate, "--dp-shard", "8", "--sharding", "zero1", "-o", str(tmp_path / "z1.json")],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.stderr
    assert "sharded over 8 data-parallel ranks (ZeRO-1: optimizer state)" in result.stdout
    full, zero1 = load_profile(tmp_path / "full.json"), load_profile(tmp_path / "z1.json")
    assert [s.static_bytes for s in zero1.stages] == pytest.approx([s.static_bytes * 5.5 / 16 for s in full.stages])

    solve = ["solve", "--profile", str(tmp_path / "full.json"), "--mem-limit", "2p", "--json", "--time-limit", "2"]
    plain = json.loads(runner.invoke(app, solve).stdout)["static_bytes_per_rank"]
    fsdp = json.loads(runner.invoke(app, [*solve, "--dp-shard", "8"]).stdout)["static_bytes_per_rank"]
    assert all(f < s / 4 for f, s in zip(fsdp, plain))
    for args, message in [(["--dp-shard", "0"], "error: --dp-shard: data-parallel shard degree 0 is out of range"),
                          (["--sharding", "zero2"], "error: --sharding zero2 goes with --dp-shard N"),
                          (["--dp-shard", "2", "--sharding", "zero3"], "error: --sharding: sharding 'zero3' is not known")]:
        result = runner.invoke(app, [*solve, *args])
        assert result.exit_code == 1 and result.stderr.startswith(message) and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("devices, stages, degree, message", [
    (32, 8, 8, "device count 32 does not allow 8 pipeline stages x 8 data-parallel shards (64 GPUs per copy does not "
               "divide 32): use a data-parallel shard degree that divides 4 (1, 2, 4)"),
    (64, 8, 3, "use a data-parallel shard degree that divides 8 (1, 2, 4, 8)"),
    (12, 8, 1, "device count 12 does not allow 8 pipeline stages (8 GPUs per copy does not divide 12): use a device "
               "count that is a multiple of 8"),
    (0, 8, 1, "device count 0 is out of range"),
])
def test_a_device_count_that_cannot_hold_the_job_is_one_line_error(devices, stages, degree, message) -> None:
    from zbsearch.core.sharding import check_devices
    with pytest.raises(ProfileError) as err:
        check_devices(devices, stages, degree)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_device_count_that_holds_the_job_passes() -> None:
    from zbsearch.core.sharding import check_devices
    check_devices(64, 8, 8)
    check_devices(128, 8, 8)  # two replicas (or tensor parallel 2)
    check_devices(8, 8)
