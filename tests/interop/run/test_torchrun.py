"""`zbsearch run`, `calibrate` and `profile` started by torchrun: two torchrun "nodes" on 127.0.0.1, one
process each, gloo. Each node is its own torchrun (--nnodes 2 --node-rank 0|1), as on two machines."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zbsearch.core.errors import RunError
from zbsearch.profiling.distributed import Torchrun, torchrun_env
from zbsearch.schedules import generate

ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_no_torchrun_variables_is_a_run_on_this_machine() -> None:
    assert torchrun_env({"PATH": "/bin"}) is None


def test_the_torchrun_environment_names_this_process() -> None:
    env = torchrun_env(ENV)
    assert env == Torchrun(rank=1, world_size=2, local_rank=0, master="10.0.0.1:29500")
    assert not env.leader
    assert env.device("nccl") == "cuda:0" and env.device("gloo") == "cpu"


@pytest.mark.parametrize("change, message", [
    ({"LOCAL_RANK": None}, "environment variable LOCAL_RANK is not set but RANK is: start the command with torchrun"),
    ({"RANK": "one"}, "environment variable RANK='one' is not a whole number"),
    ({"RANK": "2"}, "RANK=2, WORLD_SIZE=2, LOCAL_RANK=0 are out of range"),
])
def test_a_broken_torchrun_environment_is_refused_in_one_line(change: dict, message: str) -> None:
    env = {k: v for k, v in {**ENV, **change}.items() if v is not None}
    with pytest.raises(RunError, match=message):
        torchrun_env(env)


def test_a_world_that_is_not_the_schedules_rank_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from zbsearch.interop.run.launcher import run

    for key, value in {**ENV, "WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RunError, match=r"torchrun started 3 processes but schedule 'zb-h1' has 2 ranks: start 2 in "
                                       r"all \(nodes times processes per node = 2\)"):
        run(generate("zb-h1", 2, 4))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(args: list[str], cwd: Path, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """Run `python -m zbsearch ARGS` as two torchrun nodes of one process each; both finished."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
         "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "zbsearch", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    done = []
    try:
        for proc in nodes:
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in nodes:
            proc.kill()
    return done


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_torchrun_nodes_run_a_schedule_with_exact_gradients(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    generate("zb-v", 2, 4).save(tmp_path / "schedule.json")
    node0, node1 = _two_nodes(["run", "schedule.json", "--model", "gpt-tiny", "--steps", "1", "--json",
                               "-o", "result.json"], tmp_path)
    assert node0.returncode == 0, node0.stderr[-2000:]
    assert node1.returncode == 0, node1.stderr[-2000:]
    result = json.loads(node0.stdout)
    assert result == json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] and result["max_grad_diff"] < 1e-9 and result["parameters_checked"] > 0
    assert result["details"]["launcher"].startswith("torchrun (rank 0 at 127.0.0.1:")
    assert len(result["details"]["hosts"]) == 2
    # Rank 1 ran its stages (1 and 2 of the V) but left the report to rank 0.
    assert [sorted(r) for r in result["details"]["stages_per_rank"]] == [[0, 3], [1, 2]]
    assert node1.stdout == ""


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.slow
def test_under_torchrun_the_profiler_times_the_link_between_the_nodes_and_rank_0_writes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    node0, node1 = _two_nodes(["profile", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16", "-p", "2",
                               "-m", "4", "--warmup", "1", "--repeats", "2", "-o", "profile.json"], tmp_path)
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr[-2000:] + node1.stderr[-2000:]
    link = json.loads((tmp_path / "profile.json").read_text())["details"]["link"]
    assert link["origin"].startswith("measured: ping-pong of 67108864 bytes between torchrun ranks 0 (")
    assert link["gbps"] > 0
    assert "wrote profile.json" in node0.stdout and node1.stdout == ""
