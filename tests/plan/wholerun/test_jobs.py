"""Shape jobs in a local process pool: results as they end, ZbsearchErrors as one-line failures, other
exceptions propagating; the optional Ray's install hint and an unreachable address in one line."""

from __future__ import annotations

import socket
import sys
import time

import pytest
from wholerun_fakes import crash, die, nap, square, square_even, tiny_cpsat

from zbsearch.core.errors import DependencyError, PlanError
from zbsearch.plan.wholerun import jobs
from zbsearch.plan.wholerun.jobs import Done, call_job, check_reachable, open_runner, run_jobs


def test_pool_yields_every_result_and_failures_in_one_line():
    runner = open_runner(2)
    try:
        done = list(run_jobs(runner, [(k, (square_even, (k,))) for k in range(6)], 2))
    finally:
        runner.close(abort=False)
    assert sorted(done, key=lambda d: d.key) == [
        Done(0, 0), Done(1, None, "odd number 1: give an even one"), Done(2, 4),
        Done(3, None, "odd number 3: give an even one"), Done(4, 16), Done(5, None, "odd number 5: give an even one")]


def test_cpsat_runs_in_the_workers_of_a_process_that_ran_it():
    assert tiny_cpsat(3) == 3  # CP-SAT's threads started here first: a forked child could inherit a held lock
    runner = open_runner(2)
    try:
        assert sorted(d.value for d in run_jobs(runner, [(k, (tiny_cpsat, (k,))) for k in range(4)], 2)) == \
            [0, 1, 2, 3]
    finally:
        runner.close(abort=False)


def test_any_other_exception_is_a_bug_and_propagates():
    runner = open_runner(1)
    try:
        with pytest.raises(ValueError, match="a bug at 3"):
            list(run_jobs(runner, [(0, (square, (2,))), (1, (crash, (3,)))], 1))
    finally:
        runner.close(abort=True)
    assert call_job(square, (3,)) == (9, None)


def test_abort_stops_jobs_in_flight():
    runner = open_runner(2)
    runner.submit(0, (nap, (0.0,)))
    runner.submit(1, (nap, (60.0,)))
    assert runner.next_done() == Done(0, 0.0)
    start = time.monotonic()
    runner.close(abort=True)
    assert time.monotonic() - start < 10


def test_a_lost_worker_is_one_line():
    runner = open_runner(1)
    try:
        with pytest.raises(PlanError, match="^a worker process ended abruptly .* run again with it to go on$"):
            list(run_jobs(runner, [(0, (die, (3,)))], 1))
    finally:
        runner.close(abort=True)


def test_worker_count_below_one_is_refused():
    with pytest.raises(PlanError, match="^worker count 0 is not a count: give a whole number >= 1$") as caught:
        open_runner(0)
    assert caught.value.subject == "workers"


def test_ray_missing_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray then fails, installed or not
    with pytest.raises(DependencyError) as caught:
        open_runner(2, "auto")
    assert str(caught.value) == ("running shapes on a Ray cluster needs ray, which is not installed: "
                                 "pip install 'zbsearch[ray]'")


def test_an_address_nothing_listens_at_is_one_line():
    with socket.socket() as probe:  # a port just freed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(PlanError) as caught:
        check_reachable(f"127.0.0.1:{port}")
    assert caught.value.subject == "ray_address"
    assert str(caught.value).startswith(f"no Ray cluster answers at 127.0.0.1:{port} (")
    assert str(caught.value).endswith("): start one there (ray start, head node) or give the address of a running "
                                      "one, or 'auto' on one of its nodes")
    assert "\n" not in str(caught.value)
    check_reachable("auto")  # left to ray
    assert jobs.RAY_HINT == "pip install 'zbsearch[ray]'"
