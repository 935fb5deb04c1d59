"""What the tablequeue distribution brings along: its version, its templates and the example catalog.

Two ways to run the package, one rule: everything comes from the same place the code does.

- From a checkout (the Makefile's editable install, or PYTHONPATH=tools): the version is the
  checkout's pyproject.toml and the files are the checkout's own database/ and tests_tsql/, so a
  developer edits a template and re-renders without reinstalling, and a worktree renders its own
  templates even with another checkout's editable install in the same virtualenv. (An editable
  install's metadata is written at install time: after a version bump it would be stale.)
- Installed from a wheel: the version is the package metadata, and the files are package data under
  tablequeue/_data/, found with importlib.resources. pyproject.toml maps the checkout's database/ and
  tests_tsql/ folders there, so the wheel mirrors the checkout's layout below that folder.

Nothing is looked up at import: the Spark executors import tablequeue from a zip of its modules
that holds neither, and never need them.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.resources
import tomllib
from pathlib import Path

DISTRIBUTION = "tablequeue"
_PACKAGED_DATA = "_data"           # tablequeue/_data/{database,tests_tsql}/ inside a wheel
_PACKAGE_DIR = Path(__file__).resolve().parent
_CHECKOUT_ROOT = _PACKAGE_DIR.parents[1]   # in a checkout, this package is tools/tablequeue/


class DistributionError(RuntimeError):
    """The package runs neither from its checkout nor from an installed distribution."""


@functools.cache
def _checkout_pyproject() -> dict | None:
    """The checkout's pyproject.toml when this package is imported from a tablequeue checkout."""
    path = _CHECKOUT_ROOT / "pyproject.toml"
    if _PACKAGE_DIR.parent.name != "tools" or not path.is_file():
        return None
    project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    return project if project.get("name") == DISTRIBUTION else None


def checkout_root() -> Path | None:
    """The root of the tablequeue checkout this package runs from; None for an installed wheel."""
    return _CHECKOUT_ROOT if _checkout_pyproject() is not None else None


@functools.cache
def version() -> str:
    """The tool version that rendered headers and the deploy history record."""
    checkout = _checkout_pyproject()
    if checkout is not None:
        return checkout["version"]
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise DistributionError(
            f"tablequeue ({_PACKAGE_DIR}) is neither installed (no package metadata) nor "
            "imported from a checkout's tools/ folder (beside pyproject.toml): install it with pip") from None


@functools.cache
def data_root() -> Path:
    """The folder holding database/ and tests_tsql/: the checkout, or the installed package's data."""
    if _checkout_pyproject() is not None:
        return _CHECKOUT_ROOT
    packaged = importlib.resources.files(__package__) / _PACKAGED_DATA
    # Jinja's FileSystemLoader needs real folders: pip installs a wheel unpacked, so this holds
    # unless the package is imported from a zip (as the Spark executors do, which never render).
    if isinstance(packaged, Path) and (packaged / "database" / "templates").is_dir():
        return packaged
    raise DistributionError(
        f"tablequeue's templates are missing: {_PACKAGE_DIR} is not in a checkout's tools/ folder, "
        f"and its package data has no {packaged}/database/templates: reinstall tablequeue from its wheel")


def template_root() -> Path:
    """database/templates: one folder per dialect."""
    return data_root() / "database" / "templates"


def tsqlt_template_root() -> Path:
    """tests_tsql/templates: the tSQLt test classes per kind."""
    return data_root() / "tests_tsql" / "templates"


def example_catalog() -> Path:
    """database/queues.yml, the example catalog (the default of `tablequeue demo` and `test-tsql`)."""
    return data_root() / "database" / "queues.yml"
