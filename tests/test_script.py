"""The hand-run SQL Server script: what a DBA reviews and runs with sqlcmd."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tablequeue.catalog import load_catalog
from tablequeue.gosplit import split_batches
from tablequeue.render import render_catalog
from tablequeue.script import mssql_script

REPO = Path(__file__).resolve().parents[1]


def _units():
    catalog = load_catalog(REPO / "database" / "queues.yml")
    return catalog, [u for f in render_catalog(catalog, "mssql") for u in f.units]


def test_script_holds_every_unit_in_its_own_transaction_with_history() -> None:
    catalog, units = _units()
    text = mssql_script(catalog.schema, units, "database/queues.yml")
    assert text.splitlines()[2] == ":on error exit"
    assert "SET QUOTED_IDENTIFIER ON;" in text and "SET ANSI_NULLS ON;" in text and "SET XACT_ABORT ON;" in text
    for unit in units:
        assert f"-- unit {unit.name} ({unit.type})" in text
        assert f"'{unit.checksum}'" in text
    lines = text.splitlines()  # the script's own transactions stand at column 0, procedures' are indented
    assert lines.count("BEGIN TRANSACTION;") == len(units) == lines.count("COMMIT TRANSACTION;")
    queue_storage = [u for u in units if u.type == "storage" and u.queue]
    assert text.count("THROW 51007") == len(queue_storage) + 1  # and a 0.1.0 deploy history stops it
    body = text.split(":on error exit", 1)[1]
    batches = split_batches(body)
    # Each unit contributes its own batches plus BEGIN, history+COMMIT (and a guard for storage);
    # the script starts with its SET batch and the 0.1.0 history guard.
    expected = sum(len(split_batches(u.body)) + 2 for u in units) + len(queue_storage) + 2
    assert len(batches) == expected


def test_script_command_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "deploy.sql"
    result = subprocess.run([sys.executable, "-m", "tablequeue", "script", "--catalog",
                             str(REPO / "database" / "queues.yml"), "--dialect", "mssql", "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.read_text().count("GO\n") > 50
