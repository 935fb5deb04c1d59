"""Catalog validation: bad catalogs fail before anything is rendered, naming file, queue and field."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tablequeue.catalog import PREFIXED_NAMES, CatalogError, load_catalog, parse_catalog

REPO = Path(__file__).resolve().parents[1]


def catalog_file(tmp_path: Path, queues: list[dict], schema: str = "queue") -> Path:
    path = tmp_path / "catalog.yml"
    path.write_text(yaml.safe_dump({"schema": schema, "queues": queues}))
    return path


def test_example_catalog_is_valid_and_fills_defaults() -> None:
    catalog = load_catalog(REPO / "database" / "queues.yml")
    kinds = {queue.kind for queue in catalog.queues}
    assert kinds == {"heap", "fifo", "lifo", "pending", "work"}
    events = catalog.queue("events")
    assert events.options == {"dedupe": False, "notify": False}
    emails = catalog.queue("emails")
    assert emails.options["max_attempts"] == 3 and emails.options["history"] is True
    assert emails.options["priority"] is False  # default filled in


@pytest.mark.parametrize("queue, field, words", [
    ({"name": "orders; drop table x", "kind": "heap"}, "name", "not a valid queue name"),
    ({"name": "Orders", "kind": "heap"}, "name", "not a valid queue name"),
    ({"name": "a" * 41, "kind": "heap"}, "name", "too long"),
    ({"name": "tablequeue_x", "kind": "heap"}, "name", "reserved"),
    ({"name": "orders", "kind": "stack"}, "kind", "unknown kind 'stack'"),
    ({"name": "orders", "kind": "heap", "colour": "red"}, "colour", "unknown key"),
    ({"name": "orders", "kind": "heap", "payload": "xml"}, "payload", "unknown payload type"),
    ({"name": "orders", "kind": "heap", "options": {"strict": True}}, "options.strict", "belongs to kind fifo"),
    ({"name": "orders", "kind": "fifo", "options": {"max_attempts": 3}}, "options.max_attempts", "belongs to kind work"),
    ({"name": "orders", "kind": "work", "options": {"max_attempts": 0}}, "options.max_attempts", "at least 1"),
    ({"name": "orders", "kind": "work", "options": {"max_attempts": True}}, "options.max_attempts", "must be int"),
    ({"name": "orders", "kind": "work", "options": {"lease_seconds": "10"}}, "options.lease_seconds", "must be int"),
    ({"name": "orders", "kind": "work", "options": {"handler": "x; drop table y"}}, "options.handler",
     "not a valid procedure name"),
    ({"name": "orders", "kind": "work", "options": {"history_retention_days": 3}}, "options.history_retention_days",
     "only meaningful with history"),
    # A trailing newline would reach the rendered SQL's literals (a regex's $ matches before it).
    ({"name": "orders\n", "kind": "heap"}, "name", "not a valid queue name"),
    ({"name": "orders", "kind": "work", "options": {"handler": "app.h\n"}}, "options.handler",
     "not a valid procedure name"),
    ({"name": "orders", "kind": "heap", "options": {"bogus": 1}}, "options.bogus", "unknown option"),
    ({"name": "orders", "kind": "pending", "options": {"groups": True}}, "options.groups",
     "belongs to kind fifo, work"),
    ({"name": "orders", "kind": "work", "options": {"groups": True, "priority": True}}, "options.groups",
     "cannot be combined with priority"),
    ({"name": "orders", "kind": "fifo", "options": {"groups": True, "strict": True}}, "options.groups",
     "cannot be combined with strict"),
    ({"name": "orders", "kind": "fifo", "options": {"groups": "yes"}}, "options.groups", "must be bool"),
])
def test_bad_queue_is_rejected_naming_file_queue_and_field(tmp_path: Path, queue: dict, field: str,
                                                           words: str) -> None:
    path = catalog_file(tmp_path, [queue])
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    error = caught.value
    assert error.path == str(path)
    assert error.field == field
    assert words in str(error)
    assert str(path) in str(error) and f"field '{field}'" in str(error)
    assert "\n" not in str(error)


def test_error_names_the_queue_when_its_name_is_valid(tmp_path: Path) -> None:
    path = catalog_file(tmp_path, [{"name": "orders", "kind": "stack"}])
    with pytest.raises(CatalogError, match=r"queue 'orders': field 'kind'"):
        load_catalog(path)


def test_bad_schema_and_duplicates_and_top_level_keys(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="field 'schema'"):
        parse_catalog({"schema": "dbo; drop", "queues": [{"name": "a", "kind": "heap"}]})
    with pytest.raises(CatalogError, match="field 'schema'"):
        parse_catalog({"schema": "app\n", "queues": [{"name": "a", "kind": "heap"}]})
    with pytest.raises(CatalogError, match="queue 'a': field 'name': defined more than once"):
        parse_catalog({"queues": [{"name": "a", "kind": "heap"}, {"name": "a", "kind": "fifo"}]})
    with pytest.raises(CatalogError, match="field 'version': unknown key"):
        parse_catalog({"version": 2, "queues": [{"name": "a", "kind": "heap"}]})
    with pytest.raises(CatalogError, match="field 'queues'"):
        parse_catalog({"schema": "queue", "queues": []})
    # A queue named like another queue's object would share that object's name.
    for taken in ("a_dead", "a_dequeue", "a_rewinds", "ix_a_lease_start", "pk_a", "ix_a_claim", "ux_a_dedupe",
                  "df_a_attempts", "ck_a_payload_json"):
        with pytest.raises(CatalogError, match=f"queue '{taken}': field 'name': collides with an object of queue 'a'"):
            parse_catalog({"queues": [{"name": taken, "kind": "heap"}, {"name": "a", "kind": "work"}]})
    assert len(parse_catalog({"queues": [{"name": "a", "kind": "heap"}, {"name": "a_b", "kind": "heap"}]}).queues) == 2
    # The index unit is named ix_<queue>_lease_start: <queue>_lease_start is free.
    assert len(parse_catalog({"queues": [{"name": "a_lease_start", "kind": "heap"}, {"name": "a", "kind": "work"}]}).queues) == 2


def test_every_constraint_and_index_the_templates_create_is_a_name_the_catalog_reserves() -> None:
    # The collision check above is only as good as its list: every name a rendered queue gives a
    # constraint or an index (and its migrations) must be one of PREFIXED_NAMES.
    from tablequeue.render import render_catalog, render_migrations

    catalog = load_catalog(REPO / "tests" / "fixtures" / "option_matrix.yml")
    texts = [f.text for dialect in ("mssql", "postgres")
             for f in render_catalog(catalog, dialect) + render_migrations(catalog, dialect)]
    created = set()
    for text in texts:
        created |= set(re.findall(r'(?:CONSTRAINT|INDEX(?: IF NOT EXISTS)?(?: CONCURRENTLY)?(?: IF NOT EXISTS)?)\s+'
                                  r'[\["]?((?:pk|ix|ux|ck|df)_[a-z0-9_]+)', text))
    queues = sorted((q.name for q in catalog.queues), key=len, reverse=True)
    allowed = {prefix + name + suffix for name in queues for prefix, suffix in PREFIXED_NAMES}
    assert created, "no constraint or index found: the pattern no longer matches the templates"
    framework = {name for name in created if "_tablequeue_" in name}   # queues cannot start with 'tablequeue'
    assert sorted(created - allowed - framework) == []


def test_every_object_the_templates_create_is_a_name_the_catalog_reserves() -> None:
    # The same for the queue's own objects (tables, procedures, functions, types, sequences): each is
    # <queue><suffix> with a suffix of GENERATED_SUFFIXES, or a queue beside it could take its name.
    from tablequeue.catalog import GENERATED_SUFFIXES
    from tablequeue.render import render_catalog, render_migrations

    catalog = load_catalog(REPO / "tests" / "fixtures" / "option_matrix.yml")
    texts = [f.text for dialect in ("mssql", "postgres")
             for f in render_catalog(catalog, dialect) + render_migrations(catalog, dialect)]
    created = set()
    for text in texts:
        created |= set(re.findall(r'CREATE (?:OR (?:ALTER|REPLACE) )?(?:TABLE|PROCEDURE|FUNCTION|TYPE|SEQUENCE|VIEW)'
                                  r'(?: IF NOT EXISTS)?\s+[\["]?[a-z0-9_]+[\]"]?\.[\["]?([a-z0-9_]+)', text))
    queues = {q.name for q in catalog.queues}
    allowed = queues | {name + suffix for name in queues for suffix in GENERATED_SUFFIXES}
    assert len(created) > len(queues), "no object found: the pattern no longer matches the templates"
    framework = {name for name in created if name.startswith("tablequeue_")}   # queues cannot start with it
    assert sorted(created - allowed - framework) == []


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.yml")
    broken = tmp_path / "broken.yml"
    broken.write_text("queues: [\n  - name: a\n")
    with pytest.raises(CatalogError, match="not valid YAML at line"):
        load_catalog(broken)


def test_longest_generated_name_fits_postgres() -> None:
    catalog = parse_catalog({"queues": [{"name": "q" * 40, "kind": "work", "options": {"history": True}}]})
    assert catalog.queues[0].name == "q" * 40


@pytest.mark.parametrize("queue", [
    {"name": "orders; drop table x", "kind": "heap"},
    {"name": "orders", "kind": "unknown"},
    {"name": "o" * 70, "kind": "heap"},
    {"name": "orders", "kind": "heap", "options": {"strict": True}},
])
def test_cli_exits_2_with_one_line_naming_file_queue_field(tmp_path: Path, queue: dict) -> None:
    path = catalog_file(tmp_path, [queue])
    for command in (["render", "--dialect", "mssql", "--out", str(tmp_path / "out")],
                    ["deploy", "--url", "postgresql://nobody@127.0.0.1:1/none"]):
        result = subprocess.run([sys.executable, "-m", "tablequeue.cli", *command, "--catalog", str(path)],
                                capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1
        assert str(path) in lines[0] and "field '" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing rendered from an invalid catalog


def test_notify_is_refused_where_the_channel_name_would_be_longer_than_postgresql_takes() -> None:
    schema = "s" * 30
    fits = parse_catalog({"schema": schema, "queues": [{"name": "q" * 32, "kind": "fifo", "options": {"notify": True}}]})
    assert fits.queues[0].options["notify"] is True          # 30 + 1 + 32 = 63 bytes: the limit
    with pytest.raises(CatalogError) as refused:
        parse_catalog({"schema": schema, "queues": [{"name": "q" * 33, "kind": "fifo", "options": {"notify": True}}]},
                      "catalog.yml")
    assert refused.value.field == "options.notify" and refused.value.queue == "q" * 33
    assert "catalog.yml" in str(refused.value) and "64 characters" in str(refused.value)
