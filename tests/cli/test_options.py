"""cli/options.py's `naming`: a library error gets the flag whose value was wrong in front of it, and only
that flag (issue 29, defect 1: a value quoted as the fault wins over another option's value that the
message lists as a choice)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.cli.options import naming
from zbsearch.core.errors import ZbsearchError


def _named(values: dict, message: str, *, quoted: bool = False) -> str:
    with pytest.raises(ZbsearchError) as caught:
        with naming(values, quoted=quoted):
            raise ZbsearchError(message)
    return str(caught.value)


def test_the_quoted_value_wins_over_a_listed_choice() -> None:
    values = {"--partition": "atuo", "--mem-limit": "auto", "--placement": None}
    message = "partition 'atuo' is not known: use auto, even, balanced or fixed:N1,N2,..."
    assert _named(values, message, quoted=True) == f"--partition: {message}"


def test_an_outer_naming_leaves_an_inner_ones_flag() -> None:
    with pytest.raises(ZbsearchError) as caught:
        with naming({"--mem-limit": "auto"}, quoted=True):
            with naming({"--placement": "foo", "--mem-limit": "auto"}, quoted=True):
                raise ZbsearchError("placement 'foo' is not known: use one of linear, v, auto")
    assert str(caught.value) == "--placement: placement 'foo' is not known: use one of linear, v, auto"


def test_an_unquoted_mention_still_names_its_flag() -> None:
    message = "memory limit 0.01p is infeasible: raise it"
    assert _named({"--mem-limit": "0.01p", "--placement": "v"}, message, quoted=True) == f"--mem-limit: {message}"


def test_two_quoted_values_name_no_flag() -> None:
    message = "placement 'v' cannot hold partition 'even'"
    assert _named({"--placement": "v", "--partition": "even"}, message, quoted=True) == message


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
