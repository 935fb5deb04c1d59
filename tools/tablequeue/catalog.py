"""The queue catalog: load a YAML file, validate every field, fill defaults.

Validation runs before anything is rendered; every error names the file, the queue and the field,
so a DBA can fix the catalog without reading a traceback.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KINDS = ("heap", "fifo", "lifo", "pending", "work")
PAYLOAD_TYPES = ("binary", "text", "json")

# Queue names are capped so that the longest generated object name (see GENERATED_SUFFIXES)
# still fits PostgreSQL's 63-byte identifier limit; SQL Server's 128 is then never reached.
QUEUE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}\Z")
SCHEMA_NAME = re.compile(r"^[a-z][a-z0-9_]{0,29}\Z")
# A handler procedure for the in-database worker: optionally schema-qualified.
HANDLER_NAME = re.compile(r"^(?:[a-z][a-z0-9_]{0,62}\.)?[a-z][a-z0-9_]{0,62}\Z")
POSTGRES_MAX_IDENTIFIER = 63
MSSQL_MAX_IDENTIFIER = 128
RESERVED_PREFIX = "tablequeue"

# Every object a queue owns is named <queue><suffix>; the renderer uses exactly these.
GENERATED_SUFFIXES = (
    "_items", "_dead", "_history", "_enqueue", "_enqueue_batch", "_dequeue", "_complete",
    "_fail", "_extend_lease", "_stats", "_purge", "_process", "_dead_list", "_dead_requeue",
    "_dead_delete", "_history_purge", "_id_seq", "_claim", "_dedupe", "_due", "_rewinds",
    "_ownership", "_enqueue_result", "_release", "_complete_batch", "_fail_batch", "_complete_next",
    "_wait", "_wait_step", "_acks", "_lease_status", "_complete_next_result", "_groups", "_process_handler",
)
# Every constraint and index a queue owns, named <prefix><queue><suffix>. PostgreSQL puts indexes,
# SQL Server constraints, in the namespace of tables: a queue named like one of another queue's
# (a queue 'pk_a' beside a queue 'a') would collide with it (tests/test_catalog.py checks that the
# templates name nothing else).
PREFIXED_NAMES = (
    ("pk_", ""), ("pk_", "_dead"), ("pk_", "_history"),
    ("ix_", "_ready"), ("ix_", "_ready_priority"), ("ix_", "_ready_ungrouped"), ("ix_", "_ready_new"),
    # storage v2's claim indexes, still named by the migrations that retire them
    ("ix_", "_claim"), ("ix_", "_claim_priority"), ("ix_", "_claim_new"),
    ("ix_", "_lease"), ("ix_", "_lease_start"), ("ix_", "_due"),
    ("ix_", "_history_finished"), ("ix_", "_history_id"), ("ix_", "_heads"), ("ix_", "_group"),
    ("ix_", "_ungrouped"), ("pk_", "_groups"), ("ck_", "_group_key"),
    ("ux_", "_dedupe"), ("ux_", "_seq"), ("ux_", "_dead_seq"),
    ("ck_", "_dedupe_key"), ("ck_", "_payload_json"),
    ("df_", "_enqueued_at"), ("df_", "_attempts"), ("df_", "_priority"), ("df_", "_dead_priority"),
    ("df_", "_history_priority"),
)


@dataclass(frozen=True)
class OptionSpec:
    type: type
    default: Any
    minimum: int | None = None
    maximum: int | None = None


# notify: PostgreSQL only (SQL Server has no NOTIFY: its clients call wait); DESIGN.md §3b.
COMMON_OPTIONS: dict[str, OptionSpec] = {"dedupe": OptionSpec(bool, False), "notify": OptionSpec(bool, False)}
KIND_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    "heap": {},
    "fifo": {"strict": OptionSpec(bool, False), "groups": OptionSpec(bool, False)},
    "lifo": {},
    "pending": {},
    "work": {
        "max_attempts": OptionSpec(int, 5, 1, 1000),
        "lease_seconds": OptionSpec(int, 300, 1, 7 * 24 * 3600),
        "history": OptionSpec(bool, False),
        "history_retention_days": OptionSpec(int, 30, 1, 3650),
        "priority": OptionSpec(bool, False),
        "client_ids": OptionSpec(bool, False),
        "handler": OptionSpec(str, None),
        "groups": OptionSpec(bool, False),
    },
}
QUEUE_KEYS = ("name", "kind", "payload", "options")
CATALOG_KEYS = ("schema", "queues")


class CatalogError(ValueError):
    """A catalog that must not be rendered or deployed. str() is the one-line message."""

    def __init__(self, path: str, queue: str | None, field_name: str, message: str):
        self.path, self.queue, self.field, self.message = path, queue, field_name, message
        where = f"queue '{queue}'" if queue else "catalog"
        super().__init__(f"{path}: {where}: field '{field_name}': {message}")


@dataclass(frozen=True)
class Queue:
    name: str
    kind: str
    payload: str
    options: dict[str, Any] = field(default_factory=dict)

    def option(self, key: str) -> Any:
        return self.options[key]


@dataclass(frozen=True)
class Catalog:
    path: str
    schema: str
    queues: tuple[Queue, ...]

    def queue(self, name: str) -> Queue:
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise KeyError(f"{self.path}: no queue named '{name}'")


def load_catalog(path: str | Path) -> Catalog:
    """Read and validate a catalog file; raise CatalogError on the first problem found."""
    path_text = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(path_text, None, "-", f"cannot read the file: {exc.strerror}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise CatalogError(path_text, None, "-", f"not valid YAML{line}") from exc
    return parse_catalog(document, path_text)


def parse_catalog(document: Any, path: str = "<catalog>") -> Catalog:
    if not isinstance(document, dict):
        raise CatalogError(path, None, "-", "the catalog must be a mapping with 'schema' and 'queues'")
    for key in document:
        if key not in CATALOG_KEYS:
            raise CatalogError(path, None, str(key), f"unknown key (allowed: {', '.join(CATALOG_KEYS)})")
    schema = document.get("schema", "queue")
    if not isinstance(schema, str) or not SCHEMA_NAME.match(schema):
        raise CatalogError(path, None, "schema",
                           f"{schema!r} is not a valid schema name (^[a-z][a-z0-9_]{{0,29}}$)")
    raw_queues = document.get("queues")
    if not isinstance(raw_queues, list) or not raw_queues:
        raise CatalogError(path, None, "queues", "must be a non-empty list of queues")
    queues: list[Queue] = []
    seen: set[str] = set()
    for position, raw in enumerate(raw_queues, start=1):
        queue = _parse_queue(raw, position, path)
        if queue.name in seen:
            raise CatalogError(path, queue.name, "name", "defined more than once")
        seen.add(queue.name)
        queues.append(queue)
    owned = [("", suffix) for suffix in GENERATED_SUFFIXES] + list(PREFIXED_NAMES)
    for queue in queues:
        for prefix, suffix in owned:
            if prefix + queue.name + suffix in seen:
                raise CatalogError(path, prefix + queue.name + suffix, "name",
                                   f"collides with an object of queue '{queue.name}' (its '{prefix}{suffix}' "
                                   f"object is named '{prefix}{queue.name}{suffix}'): choose another name")
        channel = f"{schema}.{queue.name}"
        if queue.options.get("notify") and len(channel.encode()) > POSTGRES_MAX_IDENTIFIER:
            raise CatalogError(path, queue.name, "options.notify",
                               f"the channel '{channel}' (schema.queue) is {len(channel)} characters, PostgreSQL's "
                               f"limit for a channel name is {POSTGRES_MAX_IDENTIFIER}: shorten the schema or queue name")
    return Catalog(path=path, schema=schema, queues=tuple(queues))


def _parse_queue(raw: Any, position: int, path: str) -> Queue:
    label = f"#{position}"
    if not isinstance(raw, dict):
        raise CatalogError(path, label, "-", "each queue must be a mapping")
    name = raw.get("name")
    if isinstance(name, str) and QUEUE_NAME.match(name):
        label = name
    for key in raw:
        if key not in QUEUE_KEYS:
            raise CatalogError(path, label, str(key), f"unknown key (allowed: {', '.join(QUEUE_KEYS)})")
    _check_queue_name(name, label, path)
    kind = raw.get("kind")
    if kind not in KINDS:
        raise CatalogError(path, name, "kind", f"unknown kind {kind!r} (expected one of: {', '.join(KINDS)})")
    payload = raw.get("payload", "json")
    if payload not in PAYLOAD_TYPES:
        raise CatalogError(path, name, "payload",
                           f"unknown payload type {payload!r} (expected one of: {', '.join(PAYLOAD_TYPES)})")
    options = _parse_options(raw.get("options") or {}, name, kind, path)
    return Queue(name=name, kind=kind, payload=payload, options=options)


def _check_queue_name(name: Any, label: str, path: str) -> None:
    if not isinstance(name, str) or not name:
        raise CatalogError(path, label, "name", "missing or not a string")
    if name.startswith(RESERVED_PREFIX):
        raise CatalogError(path, label, "name", f"names starting with '{RESERVED_PREFIX}' are reserved")
    if len(name) > 40:
        longest = max(len(name) + len(s) for s in GENERATED_SUFFIXES)
        raise CatalogError(path, label, "name",
                           f"{len(name)} characters is too long: at most 40, so that generated names such as "
                           f"'{name}_enqueue_batch' ({longest} characters at most) fit PostgreSQL's "
                           f"{POSTGRES_MAX_IDENTIFIER}-character identifier limit")
    if not QUEUE_NAME.match(name):
        raise CatalogError(path, label, "name",
                           f"{name!r} is not a valid queue name: lower-case letter first, then lower-case "
                           "letters, digits or '_' (^[a-z][a-z0-9_]{0,39}$)")
    for prefix, suffix in [("", suffix) for suffix in GENERATED_SUFFIXES] + list(PREFIXED_NAMES):
        generated = f"{prefix}{name}{suffix}"
        if len(generated) > POSTGRES_MAX_IDENTIFIER:
            raise CatalogError(path, label, "name",
                               f"generated name '{generated}' exceeds {POSTGRES_MAX_IDENTIFIER} characters")


def _parse_options(raw: Any, name: str, kind: str, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise CatalogError(path, name, "options", "must be a mapping")
    specs = {**COMMON_OPTIONS, **KIND_OPTIONS[kind]}
    options: dict[str, Any] = {}
    for key, value in raw.items():
        spec = specs.get(key)
        if spec is None:
            owners = [k for k, opts in KIND_OPTIONS.items() if key in opts]
            hint = f"it belongs to kind {', '.join(owners)}" if owners else "unknown option"
            raise CatalogError(path, name, f"options.{key}",
                               f"not an option of kind '{kind}' ({hint}; allowed: {', '.join(sorted(specs))})")
        # bool is a subclass of int: reject True for an integer option explicitly.
        if not isinstance(value, spec.type) or (spec.type is int and isinstance(value, bool)):
            raise CatalogError(path, name, f"options.{key}",
                               f"must be {spec.type.__name__}, got {value!r}")
        if spec.minimum is not None and value < spec.minimum:
            raise CatalogError(path, name, f"options.{key}", f"must be at least {spec.minimum}, got {value}")
        if spec.maximum is not None and value > spec.maximum:
            raise CatalogError(path, name, f"options.{key}", f"must be at most {spec.maximum}, got {value}")
        options[key] = value
    for key, spec in specs.items():
        options.setdefault(key, spec.default)
    # Message groups order each group by enqueue order and serve groups in parallel: a priority
    # would reorder a group, and strict FIFO already serialises the whole queue (DESIGN.md §3b).
    if options.get("groups"):
        for rival in ("priority", "strict"):
            if options.get(rival):
                raise CatalogError(path, name, "options.groups",
                                   f"cannot be combined with {rival}: true (groups keep each group in enqueue "
                                   f"order and serve groups in parallel)")
    if kind == "work":
        handler = options["handler"]
        if handler is not None and not HANDLER_NAME.match(handler):
            raise CatalogError(path, name, "options.handler",
                               f"{handler!r} is not a valid procedure name ([schema.]name, lower-case)")
        if "history_retention_days" in raw and not options["history"]:
            raise CatalogError(path, name, "options.history_retention_days",
                               "only meaningful with history: true")
    return options
