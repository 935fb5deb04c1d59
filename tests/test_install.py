"""The built package works without a checkout, as a DBA or a CI pipeline installs it.

`python -m build` makes the sdist and, from that sdist, the wheel; the wheel goes into a fresh
virtualenv, and the installed `tablequeue` runs from a temporary folder outside the checkout, with no
PYTHONPATH: it renders the example catalog byte-identically to the golden files and deploys it to
the session's PostgreSQL.

Offline and quick on every run: the build runs without build isolation (the test extra pins build
and setuptools, so no backend is downloaded), and pip installs the wheel alone (--no-deps
--no-index). The fresh virtualenv sees the pinned dependencies through a .pth file naming this test
environment's site-packages: a .pth line appends a folder to sys.path after the venv's own
site-packages, so the installed wheel is found first, and no .pth file inside that folder is run (the
Makefile's editable install of the checkout stays invisible). `--system-site-packages` would not do:
it shows the base interpreter's packages, not this virtualenv's.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml

from conftest import drop_schema

pytestmark = pytest.mark.install

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
VERSION = PYPROJECT["version"]
GOLDEN = {"postgres": REPO / "database" / "rendered" / "postgres",
          "mssql": REPO / "database" / "rendered" / "mssql",
          "tsqlt": REPO / "tests_tsql" / "rendered"}


@dataclass(frozen=True)
class Installed:
    wheel: Path
    sdist: Path
    venv: Path
    workdir: Path      # outside the checkout: every command runs here

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """A command of the virtualenv's bin/, as a user who has no checkout runs it."""
        return subprocess.run([str(self.venv / "bin" / args[0]), *args[1:]], cwd=self.workdir,
                              env=_without_pythonpath(), capture_output=True, text=True, timeout=timeout)


def _without_pythonpath() -> dict[str, str]:
    """This environment without the PYTHONPATH that points a developer's python at a checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("install")
    dist = root / "dist"
    _check(subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(REPO)],
                          capture_output=True, text=True, timeout=600))
    wheel = dist / f"tablequeue-{VERSION}-py3-none-any.whl"
    sdist = dist / f"tablequeue-{VERSION}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())

    venv = root / "venv"
    _check(subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=300))
    venv_python = venv / "bin" / "python"
    _check(subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--quiet",
                           "--no-deps", "--no-index", str(wheel)], env=_without_pythonpath(),
                          capture_output=True, text=True, timeout=300))
    # After the install: pip must not see this environment's editable tablequeue as installed already.
    venv_site = Path(_check(subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=_without_pythonpath(), capture_output=True, text=True)).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (venv_site / "tablequeue-test-dependencies.pth").write_text("\n".join(ours) + "\n")

    workdir = root / "elsewhere"
    workdir.mkdir()
    return Installed(wheel, sdist, venv, workdir)


def test_wheel_holds_the_code_the_templates_and_the_example_catalog_and_no_golden_file(
        installed: Installed) -> None:
    """Built from the sdist, the wheel also proves that the sdist carried everything."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = {name for name in wheel.namelist() if ".dist-info/" not in name}
        metadata = wheel.read(f"tablequeue-{VERSION}.dist-info/METADATA").decode()
    tools = REPO / "tools"
    expected = {p.relative_to(tools).as_posix() for p in (tools / "tablequeue").rglob("*.py")}
    expected |= {p.relative_to(REPO).as_posix() for p in (REPO / "pipelines").rglob("*.py")}
    data = [REPO / "database" / "queues.yml", *(REPO / "database" / "templates").glob("*/*.sql"),
            *(REPO / "database" / "templates").glob("*/migrations/*.sql"),
            *(REPO / "database" / "templates").glob("*/work/*.sql"),
            *(REPO / "database" / "examples" / "handlers").glob("*/*.sql"),
            *(REPO / "tests_tsql" / "templates").glob("*.sql")]
    expected |= {f"tablequeue/_data/{p.relative_to(REPO).as_posix()}" for p in data}
    expected |= {"tablequeue/selftest_catalog.yml"}     # the catalog `tablequeue selftest` deploys
    assert names == expected
    for field in (f"Version: {VERSION}", f"Requires-Python: {PYPROJECT['requires-python']}",
                  f"License-Expression: {PYPROJECT['license']}", "Classifier: Topic :: Database"):
        assert field in metadata.splitlines(), field


def test_installed_tool_reports_the_version_of_its_package_metadata(installed: Installed) -> None:
    assert _check(installed.run("tablequeue", "--version")).stdout == f"tablequeue {VERSION}\n"
    where = _check(installed.run("python", "-c", (
        "import importlib.metadata, tablequeue; "
        "print(tablequeue.__file__, tablequeue.__version__, importlib.metadata.version('tablequeue'))")))
    module, version, metadata_version = where.stdout.split()
    assert Path(module).is_relative_to(installed.venv) and version == metadata_version == VERSION


def test_installed_tool_renders_the_golden_files_from_outside_the_checkout(installed: Installed) -> None:
    (installed.workdir / "queues.yml").write_bytes((REPO / "database" / "queues.yml").read_bytes())
    for target in GOLDEN:
        option = ["--tsqlt"] if target == "tsqlt" else ["--dialect", target]
        _check(installed.run("tablequeue", "render", "--catalog", "queues.yml", *option, "--out", f"out/{target}"))
    for target, golden in GOLDEN.items():
        out = installed.workdir / "out" / target
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in golden.iterdir()), target
        for expected in golden.iterdir():
            assert (out / expected.name).read_bytes() == expected.read_bytes(), f"{target}/{expected.name}"


def test_installed_tool_deploys_the_example_catalog_to_postgresql(installed: Installed, pg_url: str) -> None:
    example = yaml.safe_load((REPO / "database" / "queues.yml").read_text(encoding="utf-8"))
    schema = f"i_{secrets.token_hex(4)}"
    (installed.workdir / "deploy.yml").write_text(yaml.safe_dump({**example, "schema": schema}))
    try:
        deployed = _check(installed.run("tablequeue", "deploy", "--catalog", "deploy.yml", "--url", pg_url))
        assert "0 unchanged" in deployed.stdout
        status = _check(installed.run("tablequeue", "status", "--url", pg_url, "--catalog", "deploy.yml"))
        rows = status.stdout.splitlines()[1:]
        assert rows and all(row.split("  ")[-1].strip().startswith("ok") for row in rows), status.stdout

        with psycopg.connect(pg_url, autocommit=True) as conn:
            versions = conn.execute(
                f'SELECT DISTINCT tool_version FROM "{schema}".tablequeue_deploy_history').fetchall()
            assert versions == [(VERSION,)]
            enqueued = conn.execute(f"""SELECT id FROM "{schema}".events_enqueue(payload => '{{"n": 1}}')""").fetchone()
            dequeued = conn.execute(f'SELECT id, payload FROM "{schema}".events_dequeue(batch_size => 5)').fetchall()
            assert dequeued == [(enqueued[0], {"n": 1})]
    finally:
        drop_schema("postgres", pg_url, schema)
