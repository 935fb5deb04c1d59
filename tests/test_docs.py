"""Documentation that callers rely on stays in step with the code."""
from __future__ import annotations

import shlex
from pathlib import Path

from tablequeue.cli import build_parser, cmd_selftest
from tablequeue.errors import QUEUE_ERRORS

REPO = Path(__file__).resolve().parents[1]


def test_errors_page_lists_every_error_with_both_codes() -> None:
    page = (REPO / "docs" / "errors.md").read_text()
    for key, error in QUEUE_ERRORS.items():
        row = next((line for line in page.splitlines() if line.startswith(f"| {key} |")), None)
        assert row is not None, f"docs/errors.md has no row for {key}"
        assert f"| {error.mssql} |" in row and f"| {error.postgres} |" in row, row


def test_error_numbers_are_unique() -> None:
    assert len({e.mssql for e in QUEUE_ERRORS.values()}) == len(QUEUE_ERRORS)
    assert len({e.postgres for e in QUEUE_ERRORS.values()}) == len(QUEUE_ERRORS)


def test_readme_commands_are_the_makefile_targets_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci
    makefile = (REPO / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile


def test_the_selftest_command_in_the_sql_server_page_is_one_the_cli_accepts() -> None:
    page = (REPO / "docs" / "ci-sqlserver.md").read_text()
    section = page.split("## First thing to run: `tablequeue selftest`", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == [".venv/bin/tablequeue", "selftest"]
    args = build_parser().parse_args(words[1:])
    assert args.func is cmd_selftest
    assert args.url.startswith("mssql+pyodbc://") and args.tsqlt and args.prepare_server
    assert args.junit and args.report
