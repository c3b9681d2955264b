"""`zbsearch report` and `solve --html` through typer's CliRunner: the page is written whole after
validation, and bad input is one line with no file left behind."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from plans import with_plan
from zbsearch.cli.app import app
from zbsearch.schedules import generate

runner = CliRunner()
UNIFORM = ["--uniform", "1,1,1,0.05"]


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def one_line_error(result) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _plan(tmp_path: Path, name: str = "zb-h1", p: int = 4, m: int = 8) -> Path:
    path = tmp_path / f"{name}.json"
    generate(name, p, m).save(path)
    return path


def test_report_writes_one_page(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    result = invoke("report", _plan(tmp_path), *UNIFORM, "--mem-limit", "1p", "--time-limit", "0.5", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"wrote {out}"
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "zb-h2" in text  # the handcrafted schedules at the same limit, side by side


def test_a_plan_and_profile_that_do_not_match_is_one_line_and_no_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    message = one_line_error(invoke("report", _plan(tmp_path), *UNIFORM, "-p", "8", "-o", out))
    assert "-p 8 does not match schedule" in message
    assert not out.exists()


def test_a_plan_whose_split_names_other_layers_is_one_line_and_no_file(tmp_path: Path) -> None:
    plan = tmp_path / "split.json"
    chunks = [[f"x{r}"] for r in range(8)]
    with_plan(generate("1f1b", 8, 16), {"split": {"chunks": chunks}}).save(plan)
    out = tmp_path / "plan.html"
    message = one_line_error(invoke("report", plan, "--profile", "profiles/h100.json", "-o", out))
    assert message.startswith("error: --profile: ")
    assert not out.exists()


def test_a_plan_that_fails_validation_is_one_line_and_no_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    message = one_line_error(invoke("report", _plan(tmp_path, "zb-h2"), *UNIFORM, "--mem-limit", "1p", "-o", out))
    assert "schedule 'zb-h2' is invalid: rank 0 holds" in message
    assert not out.exists()
    broken = tmp_path / "broken.json"
    schedule = generate("1f1b", 2, 2)
    data = schedule.to_dict()
    data["actions"][0] = data["actions"][0][:-1]  # one pass missing
    broken.write_text(json.dumps(data))
    assert "is invalid" in one_line_error(invoke("report", broken, *UNIFORM, "-o", out))
    assert not out.exists()


def test_a_path_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "plan.html"
    message = one_line_error(invoke("report", _plan(tmp_path), *UNIFORM, "-o", out))
    assert message == f"error: cannot write {out}: folder {out.parent} does not exist (create it first)"
    assert one_line_error(invoke("report", _plan(tmp_path), *UNIFORM, "-o", tmp_path)).endswith(
        "it is a folder; give a file name such as plan.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zb-h1.json"]


def test_solve_writes_the_page_of_its_plan(tmp_path: Path) -> None:
    out = tmp_path / "solved.html"
    result = invoke("solve", *UNIFORM, "-p", "4", "-m", "8", "--mem-limit", "1p", "--time-limit", "2", "--html", out)
    assert result.exit_code == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    assert "the solve that made this plan" in out.read_text()


def test_compare_writes_a_page_of_its_plan_at_each_limit(tmp_path: Path) -> None:
    prefix = tmp_path / "cmp" / "out"
    result = invoke("compare", *UNIFORM, "-p", "4", "-m", "8", "--mem-limits", "1p,none", "--time-limit", "1",
                    "--figures", "none", "--schedules", "handcrafted", "-o", prefix, "--html")
    assert result.exit_code == 0, result.stderr
    for limit in ("1p", "none"):
        page = prefix.parent / f"out_m8_{limit}.html"
        assert f"wrote {page}" in result.stdout
        text = page.read_text()
        blob = text.split('<script id="plan-data" type="application/json">', 1)[1].split("</script>", 1)[0]
        data = json.loads(blob.replace("<\\/", "</"))
        assert len(data["boxes"]) == 3 * 4 * 8  # F, I and W of 8 microbatches on 4 stages: one box each
