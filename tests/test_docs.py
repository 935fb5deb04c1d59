"""Documentation that callers rely on stays in step with the code."""
from __future__ import annotations

from pathlib import Path

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
