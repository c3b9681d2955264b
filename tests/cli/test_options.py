"""cli/options.py's subject naming: a library error carries the field it is about (ZbsearchError.subject),
and the CLI puts that field's flag in front of it (SUBJECT_FLAGS), only that flag, and only where the message
names none (issue 29, defect 1: the field at fault wins over another option's value the message lists as a
choice; issue 38, deliverable 5: no flag is guessed from the wording)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import zbsearch
from zbsearch.cli.app import app
from zbsearch.cli.options import SUBJECT_FLAGS, flags_for, name_subject
from zbsearch.core.errors import ZbsearchError, about
from zbsearch.core.ir import linear
from zbsearch.core.memory import check_feasible, parse_mem_limit
from zbsearch.core.profile import uniform_profile
from zbsearch.search.partition.candidates import parse_rule


def _named(call, spelled: dict | None = None) -> str:
    """The message the CLI prints for the error `call` raises."""
    with pytest.raises(ZbsearchError) as caught:
        with flags_for(spelled or {}):
            call()
    name_subject(caught.value)
    return str(caught.value)


def test_the_field_at_fault_wins_over_a_listed_choice() -> None:
    # "auto" is the memory limit's value too, and the message lists it as a choice: the error is the rule's
    message = "partition 'atuo' is not known: use auto, even, balanced or fixed:N1,N2,..."
    assert _named(lambda: parse_rule("atuo", (), linear(2))) == f"--partition: {message}"


def test_a_commands_own_flag_is_left_by_the_default_naming() -> None:
    profile = uniform_profile(1, 2, 1, p=2, m=4)
    assert _named(lambda: parse_mem_limit("1q", profile), {"mem_limit": "--mem-limits"}).startswith(
        "--mem-limits: memory limit '1q' is not understood")


def test_an_infeasible_limit_names_the_limit() -> None:
    profile = uniform_profile(1, 2, 1, p=2, m=4)
    named = _named(lambda: check_feasible(profile, linear(2), parse_mem_limit("0.01p", profile)))
    assert named.startswith("--mem-limit: memory limit 0.01p is infeasible")


def test_an_error_about_no_field_names_no_flag() -> None:
    message = "placement 'v' cannot hold partition 'even'"

    def fail() -> None:
        raise ZbsearchError(message)

    assert _named(fail) == message


def test_the_innermost_subject_stays_unless_the_step_claims_its_errors() -> None:
    def fail() -> None:
        with about("mem_limit"):
            with about("placement"):
                raise ZbsearchError("placement 'foo' is not known")

    assert _named(fail) == "--placement: placement 'foo' is not known"
    with pytest.raises(ZbsearchError) as caught:
        with about("profile", overriding=True):
            raise ZbsearchError("layers per chunk 1,2 add up to 3", subject="partition")
    assert caught.value.subject == "profile"


def test_every_subject_the_library_names_has_a_flag() -> None:
    package = Path(zbsearch.__file__).parent
    named: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "subject" and isinstance(node.value, ast.Constant):
                named.add(str(node.value.value))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "about" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                named.add(str(node.args[0].value))
    assert len(named) > 20  # the scan really reads the raise sites
    assert sorted(named - set(SUBJECT_FLAGS)) == []


@pytest.mark.parametrize("args,flag", [
    (["--profile", "profiles/h100.json", "-p", "8", "--partition", "atuo", "--mem-limit", "auto"], "--partition"),
    (["--profile", "profiles/h100.json", "--placement", "foo", "--mem-limit", "auto"], "--placement"),
    (["--uniform", "1,2,1", "-p", "4", "-m", "8", "--placement", "foo", "--mem-limit", "auto"], "--placement"),
])
def test_solve_blames_the_flag_that_was_wrong(args: list[str], flag: str) -> None:
    result = CliRunner().invoke(app, ["solve", *args])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].startswith(f"error: {flag}: "), result.output


@pytest.mark.parametrize("limit,warns", [("80gb", True), ("70GiB", True), ("68GiB", False), ("auto", False), ("2p", False)])
def test_a_size_above_the_device_less_its_headroom_warns(limit: str, warns: bool) -> None:
    # profiles/h100.json: an 80 GB device (74.5 GiB), 8% headroom by default: 68.5 GiB usable; the profile
    # lists its layers, so a size is a rank's whole memory.
    result = CliRunner().invoke(app, ["solve", "--profile", "profiles/h100.json", "--mem-limit", limit,
                                      "--time-limit", "5", "--json"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: --mem-limit: ")]
    assert len(warned) == (1 if warns else 0), result.stderr
    if warns:
        assert "68.5 GiB" in warned[0] and "use auto" in warned[0]


@pytest.mark.parametrize("args,placement", [
    (["--profile", "profiles/h100.json"], "auto"),             # lists its layers
    (["--uniform", "1,2,1", "-p", "4", "-m", "8"], "linear"),
    (["--profile", "profiles/h100.json", "--placement", "v"], "v"),
])
def test_compare_solves_on_the_placement_its_help_names(monkeypatch: pytest.MonkeyPatch, tmp_path, args: list[str],
                                                        placement: str) -> None:
    # issue 29, defect 2: the help said auto on a profile that lists its layers while linear ran.
    from zbsearch.cli import compare as cli_compare

    asked = {}

    def stop(*_args, **kwargs):
        asked.update(kwargs)
        raise ZbsearchError("stopped by the test")

    monkeypatch.setattr(cli_compare.cmp, "compare", stop)
    result = CliRunner().invoke(app, ["compare", "-o", str(tmp_path / "out"), *args, "--figures", "none"])
    assert "stopped by the test" in result.output, result.output
    assert asked["placement"] == placement
    assert "[default: linear]" not in CliRunner().invoke(app, ["compare", "--help"]).output


def test_a_fixed_split_under_auto_solves_on_the_placement_its_counts_fit() -> None:
    # issue 29, defect 4: 8 counts on 8 ranks fit linear; auto used to fail on V asking for 16 counts.
    result = CliRunner().invoke(app, ["solve", "--profile", "profiles/h100.json", "--partition",
                                      "fixed:5,4,4,4,4,4,4,5", "--mem-limit", "auto", "--time-limit", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["placement"] == "linear"


@pytest.mark.parametrize("args,says", [
    (["--partition", "fixed:5,4,4,4,4,4,4,5", "--placement", "v"],
     "error: --partition: layers per chunk 5,4,4,4,4,4,4,5 give 8 chunks but placement 'v' on 8 ranks has 16: "
     "give 16 counts in route order, or use placement linear (8 chunks)"),
    (["--partition", "fixed:2,3,3,3,3,3,3,2"],
     "the model has 34 layers (every entry of the profile's layers list, the embedding and the head included)"),
])
def test_a_fixed_split_that_does_not_fit_says_what_would(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["solve", "--profile", "profiles/h100.json", *args, "--mem-limit", "auto"])
    assert result.exit_code == 1
    assert says in " ".join(result.output.split()), result.output
