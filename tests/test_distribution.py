"""Where the package finds its version, templates and example catalog when it runs from a checkout,
and what it says when it has neither a checkout nor an installation (tests/test_install.py covers
the installed wheel)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tablequeue import distribution

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_a_checkout_supplies_its_own_version_templates_and_example_catalog() -> None:
    """Editable installs and PYTHONPATH=tools: a template edit renders without a reinstall, and a
    version bump in pyproject.toml shows at once (an editable install's metadata would be stale)."""
    assert distribution.version() == VERSION
    assert distribution.template_root() == REPO / "database" / "templates"
    assert distribution.tsqlt_template_root() == REPO / "tests_tsql" / "templates"
    assert distribution.example_catalog() == REPO / "database" / "queues.yml"


def test_version_option_prints_the_pyproject_version() -> None:
    result = subprocess.run([sys.executable, "-m", "tablequeue", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"tablequeue {VERSION}\n"


def test_a_copy_that_is_neither_installed_nor_in_a_checkout_says_so(tmp_path: Path) -> None:
    """The package folder copied elsewhere, run without site-packages (so no package metadata)."""
    shutil.copytree(REPO / "tools" / "tablequeue", tmp_path / "lib" / "tablequeue",
                    ignore=shutil.ignore_patterns("__pycache__"))
    probe = (f"import sys; sys.path.insert(0, {str(tmp_path / 'lib')!r})\n"
             "from tablequeue import distribution\n"
             "for lookup in (distribution.version, distribution.template_root):\n"
             "    try:\n"
             "        print('found', lookup())\n"
             "    except distribution.DistributionError as exc:\n"
             "        print(exc)\n")
    # -I: no PYTHONPATH, no current folder; -S: no site-packages, so no package metadata either.
    result = subprocess.run([sys.executable, "-I", "-S", "-c", probe], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    version_error, templates_error = result.stdout.splitlines()
    assert "neither installed (no package metadata) nor imported from a checkout" in version_error
    assert "templates are missing" in templates_error and "database/templates" in templates_error
    assert str(tmp_path / "lib" / "tablequeue") in version_error + templates_error
