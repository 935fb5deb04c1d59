"""Guard: a storage unit's SQL changes only with a new storage version (docs/upgrades.md).

A deployed storage unit is never re-applied at the version it already has (it holds messages), so
a change of its SQL beyond comments and whitespace that keeps the version would reach new installs
and never the deployed ones. tests/fixtures/storage_versions.json records, per dialect, the version,
shape and normalised text of every storage unit of the option matrix and the example catalog; a
test here fails, naming the unit, when the text changed and the version did not.

After a deliberate change (a new version with its migrations, a new unit, or an edit that really
does not change the object), record it:

    python tests/test_storage_versions.py --update
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # run as a script: import this checkout's package
    sys.path[:0] = [str(REPO / "tools")]

from tablequeue.catalog import load_catalog  # noqa: E402
from tablequeue.gosplit import without_comments  # noqa: E402
from tablequeue.render import DIALECTS, MigrationSource, Unit, render_catalog  # noqa: E402

MANIFEST = REPO / "tests" / "fixtures" / "storage_versions.json"
CATALOGS = [REPO / "tests" / "fixtures" / "option_matrix.yml", REPO / "database" / "queues.yml"]
UPDATE = "python tests/test_storage_versions.py --update"


def normalised_hash(body: str) -> str:
    """The unit's SQL without comments, whitespace runs as one space: what the object is made of."""
    return hashlib.sha256(" ".join(without_comments(body).split()).encode("utf-8")).hexdigest()


def storage_units() -> dict[str, dict[str, Unit]]:
    units: dict[str, dict[str, Unit]] = {}
    for dialect in DIALECTS:
        units[dialect] = {}
        for path in CATALOGS:
            for rendered in render_catalog(load_catalog(path), dialect):
                for unit in rendered.units:
                    if unit.storage is not None:
                        units[dialect][unit.name] = unit
    return units


def current_manifest() -> dict[str, dict[str, dict]]:
    return {dialect: {name: {"version": unit.storage.version, "shape": unit.storage.shape_text,
                             "sha256": normalised_hash(unit.body)}
                      for name, unit in sorted(units.items())}
            for dialect, units in storage_units().items()}


def test_storage_text_changes_only_with_a_new_version() -> None:
    recorded = json.loads(MANIFEST.read_text())
    problems = []
    for dialect, units in current_manifest().items():
        for name, now in units.items():
            before = recorded.get(dialect, {}).get(name)
            where = f"{dialect} storage unit {name} ({now['shape'] or 'framework'})"
            if before is None:
                problems.append(f"{where} is new: record it ({UPDATE})")
            elif now["version"] < before["version"]:
                problems.append(f"{where} went back from v{before['version']} to v{now['version']}: "
                                "versions only move forward")
            elif now["version"] == before["version"] and now["sha256"] != before["sha256"]:
                problems.append(
                    f"{where} changed beyond comments and whitespace but still declares v{now['version']}, "
                    f"so deployed queues would never get the change: bump its version in the template and "
                    f"add migrations/<kind>_<role>_v{now['version']}_to_v{now['version'] + 1}.sql in both "
                    f"dialects; if the change really leaves the object as it was, record it ({UPDATE}) "
                    "and say why in the commit")
            elif now["version"] > before["version"]:
                problems.append(f"{where} is now v{now['version']} (recorded v{before['version']}): "
                                f"record it ({UPDATE})")
        for name in recorded.get(dialect, {}).keys() - units.keys():
            problems.append(f"{dialect} storage unit {name} is recorded but no longer rendered: {UPDATE}")
    assert not problems, "\n".join(problems)


def test_every_storage_version_has_its_migrations() -> None:
    missing = []
    for dialect, units in storage_units().items():
        source = MigrationSource(dialect)
        for unit in units.values():
            if unit.object == "type":
                continue   # a type holds no data: it is dropped and created again with its routines
            for version in range(1, unit.storage.version):
                if source.find(unit, f"v{version}_to_v{version + 1}") is None:
                    missing.append(f"{dialect} {unit.name}: no migration from v{version} to v{version + 1}")
    assert not missing, "\n".join(missing)


def test_the_guard_sees_a_changed_column_and_not_a_changed_comment() -> None:
    body = "-- the queue\nCREATE TABLE t (\n    id bigint, -- its id\n    note text\n);\n"
    assert normalised_hash(body) == normalised_hash(body.replace("-- its id", "-- the id").replace("    ", "  "))
    assert normalised_hash(body) != normalised_hash(body.replace("note text", "note varchar(10)"))
    assert normalised_hash("SELECT '-- not a comment';") != normalised_hash("SELECT '';")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE}")
    MANIFEST.write_text(json.dumps(current_manifest(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {MANIFEST.relative_to(REPO)}")
