"""The rendered T-SQL that the static checks read: the golden files, the option matrix and the
storage migrations of each.

check-tsql parses each batch once per process (tablequeue.tsqlcheck keeps the analyses), so the
test modules that share these renders in one pytest run parse them once.
"""
from __future__ import annotations

import functools
from pathlib import Path

from tablequeue.catalog import load_catalog
from tablequeue.render import render_catalog, render_migrations, render_tsqlt
from tablequeue.tsqlcheck import Report, check_sources

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "database" / "queues.yml"
MATRIX = REPO / "tests" / "fixtures" / "option_matrix.yml"
CATALOGS = [GOLDEN, MATRIX]


def golden_sources() -> list[tuple[str, str]]:
    """The checked-in golden files (test_render.py proves they are what the templates render)."""
    files = sorted((REPO / "database" / "rendered" / "mssql").glob("*.sql"))
    files += sorted((REPO / "tests_tsql" / "rendered").glob("*.sql"))
    return [(str(f.relative_to(REPO)), f.read_text(encoding="utf-8")) for f in files]


def rendered_sources(catalog_path: Path, tsqlt: bool = True) -> list[tuple[str, str]]:
    """One catalog rendered for SQL Server (and its tSQLt classes), then every migration its storage
    can take, named as `make lint` writes them (the golden catalog's migrations are not checked in:
    named as `render --migrations --out build/lint/golden-migrations` would write them)."""
    catalog = load_catalog(catalog_path)
    if catalog_path == GOLDEN:
        sources = [s for s in golden_sources() if tsqlt or s[0].startswith("database/")]
        migrations = "build/lint/golden-migrations"
    else:
        sources = [(f"build/lint/mssql/{f.name}", f.text) for f in render_catalog(catalog, "mssql")]
        if tsqlt:
            sources += [(f"build/lint/tsqlt/{f.name}", f.text) for f in render_tsqlt(catalog)]
        migrations = "build/lint/mssql-migrations"
    return sources + [(f"{migrations}/{f.name}", f.text) for f in render_migrations(catalog, "mssql")]


@functools.cache
def checked_sources(catalog_path: Path) -> tuple[tuple[str, str], ...]:
    """What ``report`` checks: the golden tSQLt classes too (the option matrix's classes repeat their
    shapes for 15,000 lines: `make lint` checks those)."""
    return tuple(rendered_sources(catalog_path, tsqlt=catalog_path == GOLDEN))


@functools.cache
def report(catalog_path: Path) -> Report:
    """check-tsql over one catalog's SQL Server renders (``checked_sources``)."""
    return check_sources(list(checked_sources(catalog_path)))
