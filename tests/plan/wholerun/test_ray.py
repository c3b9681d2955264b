"""Shapes as Ray tasks on a two-node Ray cluster started here (`ray start`, a head and a second node of one
CPU each): the same table as the local process pool on the fake entry points, and an address nothing
answers at in one line.

ray comes with the `ray` extra, which CI installs (.ci/run). ZBSEARCH_RAY_PYTHON names another interpreter
that has it (a separate venv), else this one runs the cluster and the driver. Ray binds this machine's own
interface address (it resolves 127.0.0.1 to it for a multi-node cluster), so nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from wholerun_fakes import FAKE_JOBS, tiny_setup

from zbsearch.plan.wholerun.search import Settings, search_shapes
from zbsearch.plan.wholerun.shape import Space
from zbsearch.search.options import SearchOptions

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[3]
PYTHON = os.environ.get("ZBSEARCH_RAY_PYTHON", sys.executable)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "RAY_USAGE_STATS_ENABLED": "0"}
SPACE = Space(tp=(1, 2))
DRIVER = """
import json, socket, sys
from wholerun_fakes import FAKE_JOBS, tiny_setup
from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun.jobs import open_runner
from zbsearch.plan.wholerun.search import Settings, search_shapes
from zbsearch.plan.wholerun.shape import Space
from zbsearch.search.options import SearchOptions

import ray, time
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)  # the second node joins while the head answers already
nodes = len([n for n in ray.nodes() if n["Alive"]])
outcome = search_shapes(*tiny_setup(), Space(tp=(1, 2)), FAKE_JOBS, SearchOptions(time_limit=8.0),
                        Settings(workers=2, ray_address=sys.argv[1]))
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
try:
    open_runner(2, f"127.0.0.1:{port}")
    error = None
except PlanError as exc:
    error = [exc.subject, str(exc)]
print(json.dumps({"table": outcome.table(), "ran": outcome.ran, "unreachable": error, "nodes": nodes,
                  "cpus": ray.cluster_resources()["CPU"]}))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ray_start(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """`ray start ... --block` in a session of its own: every process Ray starts for it stays in that session."""
    command = [PYTHON, "-m", "ray.scripts.scripts", "start", "--num-cpus", "1", "--object-store-memory",
               "100000000", "--disable-usage-stats", "--block", *args]
    with open(log, "wb") as out:
        return subprocess.Popen(command, env=ENV, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _session_pids(sessions: set[int]) -> list[int]:
    """The live processes of these sessions (Linux /proc stat: state, parent, group, session; a zombie is
    dead already, waiting for a parent that may never reap it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and fields[0] != "Z" and int(fields[3]) in sessions:
            found.append(int(entry.name))
    return found


def _stop(started: list[subprocess.Popen[bytes]]) -> None:
    """Kill every process of the sessions the two `ray start`s lead, by id, and reap the two."""
    sessions = {p.pid for p in started}
    for _ in range(3):
        for pid in _session_pids(sessions):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in started:
            process.wait(timeout=10)
        time.sleep(0.2)
    assert _session_pids(sessions) == []


def _wait_for(port: int, head: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and head.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the Ray head did not start: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """The address of a two-node Ray cluster on this machine, torn down whatever the test did."""
    folder = Path(tempfile.mkdtemp(prefix="zbray", dir="/tmp"))  # short: Ray's socket paths live under it
    port, started = _free_port(), []
    try:
        started.append(_ray_start("--head", "--port", str(port), "--temp-dir", str(folder),
                                  "--include-dashboard=false", log=folder / "head.log"))
        _wait_for(port, started[0], folder / "head.log")
        started.append(_ray_start("--address", f"127.0.0.1:{port}", log=folder / "node.log"))
        yield f"127.0.0.1:{port}"
    finally:
        _stop(started)
        shutil.rmtree(folder, ignore_errors=True)


def test_ray_tasks_give_the_local_pools_table(ray_cluster: str) -> None:
    local = search_shapes(*tiny_setup(), SPACE, FAKE_JOBS, SearchOptions(time_limit=8.0), Settings(workers=2))
    run = subprocess.run([PYTHON, "-c", DRIVER, ray_cluster], env=ENV, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    assert (answer["nodes"], answer["cpus"]) == (2, 2.0)
    assert answer["table"] == json.loads(json.dumps(local.table()))
    assert answer["ran"] >= local.ran - len(local.pruned)
    subject, message = answer["unreachable"]
    assert subject == "ray_address" and message.startswith("no Ray cluster answers at 127.0.0.1:")
    assert "\n" not in message
