"""Render a validated catalog into SQL for one dialect, and the migrations between storage versions.

Each queue becomes one file made of *units*: storage units (a table, an index, a sequence or a type,
each with the storage version its template declares) and one code unit per procedure/function
(replaced whenever its text changes). A unit starts with a marker line so the deploy tool can track
each one separately:

    -- tablequeue:unit queue.jobs storage v1 table
    -- tablequeue:shape kind=work payload=json client_ids=off dedupe=on priority=off
    -- tablequeue:unit queue.jobs_dequeue code

A storage unit is identified by its version and its shape (the kind and the catalog options that
decide its columns and indexes), never by its text: a comment edit changes nothing, and a change
of either is applied by migrations (database/templates/<dialect>/migrations/, docs/upgrades.md).
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .catalog import COMMON_OPTIONS, KIND_OPTIONS, Catalog, Queue
from .distribution import template_root, tsqlt_template_root, version
from .errors import QUEUE_ERRORS

DIALECTS = ("mssql", "postgres")
FRAMEWORK = "_framework"
UNIT_MARKER = re.compile(
    r"^-- tablequeue:unit (?P<name>\S+) (?P<type>storage|code)(?: v(?P<version>[0-9]+) (?P<object>\w+))?[ \t]*\r?\n"
    r"(?:-- tablequeue:shape (?P<shape>[^\r\n]*)\r?\n)?", re.MULTILINE)
STORAGE_OBJECTS = ("table", "index", "sequence", "type")
# A migration template's steps: each runs on its own, in a transaction with a lock timeout, or
# (PostgreSQL, CREATE/DROP INDEX CONCURRENTLY) outside any transaction; an after-code step runs
# once the deploy has replaced the code units (it removes what the old procedures still use).
STEP_MARKER = re.compile(r"^-- tablequeue:step (?P<mode>transaction|concurrent)(?P<after_code> after-code)? "
                         r"(?P<what>[^\r\n]+)\r?\n"
                         r"-- locks: (?P<locks>[^\r\n]+(?:\r?\n--  +[^\r\n]+)*)\r?\n", re.MULTILINE)
MIGRATIONS = "migrations"
# Kinds whose storage templates are shared (_destructive.sql) also share their migrations.
# Catalog options that shape storage (a change is a migration); payload and kind shape it too.
BOOLEAN_SHAPE_KEYS = ("client_ids", "dedupe", "priority", "groups")
KIND_FAMILIES = {"heap": "destructive", "fifo": "destructive", "lifo": "destructive", "pending": "destructive"}

# Which role may execute which verb (DESIGN.md §3).
VERB_ROLES = {
    "enqueue": "producer", "enqueue_batch": "producer",
    "dequeue": "consumer", "complete": "consumer", "fail": "consumer", "extend_lease": "consumer",
    "release": "consumer", "lease_status": "consumer", "complete_batch": "consumer", "fail_batch": "consumer", "complete_next": "consumer",
    "wait": "consumer", "wait_step": "consumer",
    "stats": "admin", "purge": "admin", "process": "admin", "dead_list": "admin",
    "dead_requeue": "admin", "dead_delete": "admin", "history_purge": "admin",
}
PAYLOAD_TYPES = {
    "mssql": {"binary": "varbinary(MAX)", "text": "nvarchar(MAX)", "json": "nvarchar(MAX)"},
    "postgres": {"binary": "bytea", "text": "text", "json": "jsonb"},
}


class RenderError(RuntimeError):
    pass


@dataclass(frozen=True)
class Storage:
    """What identifies a storage unit: the version its template declares and its shape, the kind and
    the catalog options that decide its columns and indexes (never its text)."""
    version: int
    shape: tuple[tuple[str, str], ...] = ()   # ("kind", "work"), then ("dedupe", "on"), ... as rendered

    @property
    def kind(self) -> str | None:
        return dict(self.shape).get("kind")

    @property
    def shape_text(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.shape)

    def value(self, key: str) -> str | None:
        """A shape value; a key the unit's shape does not name is at its default (an option added
        to a unit's shape later was off for everything deployed before)."""
        values = dict(self.shape)
        if key in values:
            return values[key]
        return "off" if key in BOOLEAN_SHAPE_KEYS else None

    def matches(self, other: "Storage") -> bool:
        """The same version and the same value of every shape key either names: a boolean key one of
        them omits is off there (option groups is in a unit's shape only when on, so that the units
        of queues without it keep the shape they were recorded with)."""
        keys = dict(self.shape).keys() | dict(other.shape).keys()
        return self.version == other.version and all(self.value(key) == other.value(key) for key in keys)

    def describe(self) -> str:
        return f"v{self.version}" + (f" ({self.shape_text})" if self.shape else "")

    @staticmethod
    def parse_shape(text: str | None) -> tuple[tuple[str, str], ...]:
        pairs = []
        for item in (text or "").split():
            key, sep, value = item.partition("=")
            if not sep or not key or not value:
                raise RenderError(f"storage shape {text!r}: {item!r} is not key=value")
            pairs.append((key, value))
        return tuple(pairs)


@dataclass(frozen=True)
class Unit:
    name: str            # schema-qualified object name, e.g. queue.jobs_dequeue
    type: str            # storage | code
    queue: str | None    # None for the framework units
    body: str
    storage: Storage | None = None   # storage units only
    object: str | None = None        # storage units only: table | index | sequence | type

    @property
    def checksum(self) -> str:
        return checksum(self.body)

    @property
    def role(self) -> str:
        """What the unit is to its queue, as migration templates are named: table, dead, history,
        items, rewinds, ix_lease_start...; a framework unit's role is its name."""
        _, name = self.name.split(".", 1)
        if self.queue is None:
            return name
        if name == self.queue:
            return "table"
        if name.startswith(self.queue + "_"):
            return name[len(self.queue) + 1:]
        prefix, _, rest = name.partition("_")   # an index unit: <prefix>_<queue>_<purpose>
        if rest.startswith(self.queue + "_"):
            return f"{prefix}_{rest[len(self.queue) + 1:]}"
        raise RenderError(f"unit {self.name} is not named after its queue '{self.queue}'")

    @property
    def migration_kind(self) -> str:
        """The kind migration templates are named after ('framework' for the framework units)."""
        kind = self.storage.kind if self.storage else None
        return kind or "framework"


@dataclass(frozen=True)
class RenderedFile:
    name: str            # file name, e.g. jobs.sql
    queue: str | None
    text: str

    @property
    def units(self) -> list[Unit]:
        return parse_units(self.text, self.queue)


def checksum(body: str) -> str:
    """Checksum of a unit's SQL, blind to line endings and trailing blanks (not to anything else)."""
    normalised = "\n".join(line.rstrip() for line in body.replace("\r\n", "\n").strip().split("\n"))
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def parse_units(text: str, queue: str | None) -> list[Unit]:
    matches = list(UNIT_MARKER.finditer(text))
    units = []
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end():end].strip("\n") + "\n"
        storage, obj = None, None
        if match["type"] == "storage":
            if match["version"] is None or match["object"] not in STORAGE_OBJECTS:
                raise RenderError(f"unit {match['name']}: a storage unit's marker must declare its version and "
                                  f"object ('storage v<N> {'|'.join(STORAGE_OBJECTS)}'), got {match.group(0)!r}")
            storage, obj = Storage(int(match["version"]), Storage.parse_shape(match["shape"])), match["object"]
        elif match["version"] is not None or match["shape"] is not None:
            raise RenderError(f"unit {match['name']}: a code unit has no storage version or shape")
        units.append(Unit(match["name"], match["type"], queue, body, storage, obj))
    return units


def shape_of(queue: Queue, keys: tuple[str, ...] | list[str]) -> str:
    """The shape line of a queue's storage unit: its kind, then the named shape keys' values."""
    pairs = [("kind", queue.kind)]
    for key in keys:
        if key == "payload":
            pairs.append((key, queue.payload))
        elif key in BOOLEAN_SHAPE_KEYS:
            pairs.append((key, "on" if queue.options.get(key) else "off"))
        else:
            raise RenderError(f"unknown storage shape key {key!r} (known: payload, {', '.join(BOOLEAN_SHAPE_KEYS)})")
    return " ".join(f"{key}={value}" for key, value in pairs)


class Names:
    """Every object name of one queue, quoted for one dialect. Templates use nothing else."""

    def __init__(self, dialect: str, schema: str, queue: str):
        self.dialect, self.schema, self.queue = dialect, schema, queue

    def quote(self, identifier: str) -> str:
        return f"[{identifier}]" if self.dialect == "mssql" else f'"{identifier}"'

    def qualified(self, identifier: str) -> str:
        return f"{self.quote(self.schema)}.{self.quote(identifier)}"

    def obj(self, suffix: str = "") -> str:
        """Quoted, schema-qualified name of the queue's object with this suffix ('' = the queue table)."""
        return self.qualified(self.queue + suffix)

    def plain(self, suffix: str = "") -> str:
        """Unquoted schema.name, as the deploy history and the unit markers record it."""
        return f"{self.schema}.{self.queue}{suffix}"

    def verb(self, verb: str) -> str:
        return self.obj("_" + verb)

    def role(self, verb: str) -> str:
        return self.quote(f"{self.schema}_{VERB_ROLES[verb]}")

    def index(self, prefix: str, purpose: str = "") -> str:
        return self.quote(self._index_name(prefix, purpose))

    def index_name(self, prefix: str, purpose: str = "") -> str:
        """The bare name of one of the queue's indexes or constraints, as the catalog views show it."""
        return self._index_name(prefix, purpose)

    def index_plain(self, prefix: str, purpose: str = "") -> str:
        """Unquoted schema.name of an index that is a storage unit of its own."""
        return f"{self.schema}.{self._index_name(prefix, purpose)}"

    def _index_name(self, prefix: str, purpose: str) -> str:
        return f"{prefix}_{self.queue}" + (f"_{purpose}" if purpose else "")


@functools.lru_cache(maxsize=None)
def _environment(dialect: str, extra_root: Path | None = None) -> jinja2.Environment:
    """One environment per template root: it keeps the compiled templates (it recompiles a template
    whose file changed), so rendering many catalogs in one process compiles each template once."""
    roots = [str(template_root() / dialect)]
    if extra_root is not None:
        roots.insert(0, str(extra_root))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(roots),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.globals["errors"] = {key: (err.mssql if dialect == "mssql" else err.postgres)
                             for key, err in QUEUE_ERRORS.items()}
    env.globals["version"] = version()
    env.globals["shape_of"] = shape_of
    return env


def _header(template: str, dialect: str, kind: str, target: str) -> str:
    return (f"-- tablequeue {version()} | generated: do not edit\n"
            f"-- template: {template} | dialect: {dialect} | kind: {kind} | {target}\n")


def _context(dialect: str, schema: str, queue: Queue | None) -> dict:
    names = Names(dialect, schema, queue.name if queue else "")
    context = {"dialect": dialect, "schema": schema, "names": names,
               "schema_q": names.quote(schema),
               "roles": {r: names.quote(f"{schema}_{r}") for r in ("producer", "consumer", "admin")}}
    if queue is not None:
        context.update(queue=queue, kind=queue.kind, opt=queue.options,
                       payload_type=PAYLOAD_TYPES[dialect][queue.payload],
                       is_json=queue.payload == "json")
    return context


def _dialect_root(extra_root: Path | None, dialect: str) -> Path | None:
    """A template root that overrides or adds templates: a folder with one subfolder per dialect."""
    return extra_root / dialect if extra_root is not None else None


def render_framework(catalog: Catalog, dialect: str, extra_root: Path | None = None) -> RenderedFile:
    template = f"{FRAMEWORK}.sql"
    env = _environment(dialect, _dialect_root(extra_root, dialect))
    body = env.get_template(template).render(**_context(dialect, catalog.schema, None))
    header = _header(f"{dialect}/{template}", dialect, "framework", f"schema: {catalog.schema}")
    return RenderedFile(f"{FRAMEWORK}.sql", None, header + body)


# The (dialect, kind) pairs whose templates render option groups (issue 21). The catalog accepts the
# option on fifo and work; a pair not listed refuses it here, so that no deploy creates a queue without
# groups that its catalog says has them.
GROUPS_RENDERED: frozenset[tuple[str, str]] = frozenset({("postgres", "work"), ("postgres", "fifo"), ("mssql", "fifo"),
                                                   ("mssql", "work")})


def render_queue(catalog: Catalog, queue: Queue, dialect: str, extra_root: Path | None = None) -> RenderedFile:
    if queue.options.get("groups") and (dialect, queue.kind) not in GROUPS_RENDERED:
        raise RenderError(f"{catalog.path}: queue '{queue.name}': field 'options.groups': the {dialect} templates "
                          f"of kind '{queue.kind}' do not render message groups yet (issue 21)")
    template = f"{queue.kind}.sql"
    env = _environment(dialect, _dialect_root(extra_root, dialect))
    try:
        body = env.get_template(template).render(**_context(dialect, catalog.schema, queue))
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"{catalog.path}: queue '{queue.name}': no {dialect} template for kind "
                          f"'{queue.kind}' ({template_root() / dialect / template})") from exc
    except jinja2.UndefinedError as exc:
        raise RenderError(f"{dialect}/{template} for queue '{queue.name}': {exc}") from exc
    header = _header(f"{dialect}/{template}", dialect, queue.kind, f"queue: {catalog.schema}.{queue.name}")
    return RenderedFile(f"{queue.name}.sql", queue.name, header + body)


def render_catalog(catalog: Catalog, dialect: str, extra_root: Path | None = None) -> list[RenderedFile]:
    """Every file of the catalog; extra_root (tests) is a template root whose <dialect>/ folder
    overrides the project's templates."""
    if dialect not in DIALECTS:
        raise RenderError(f"unknown dialect {dialect!r} (expected one of: {', '.join(DIALECTS)})")
    files = [render_framework(catalog, dialect, extra_root)]
    files.extend(render_queue(catalog, queue, dialect, extra_root) for queue in catalog.queues)
    return files


def render_tsqlt(catalog: Catalog) -> list[RenderedFile]:
    """tSQLt test classes for every queue whose kind has a test template."""
    tsqlt_root = tsqlt_template_root()
    env = _environment("mssql", tsqlt_root)
    files = []
    for queue in catalog.queues:
        template = f"test_{queue.kind}.sql"
        if not (tsqlt_root / template).exists():
            continue
        context = _context("mssql", catalog.schema, queue)
        context["test_class"] = f"[test_{catalog.schema}_{queue.name}]"
        context["verb_roles"] = _granted_verbs(catalog, queue)
        body = env.get_template(template).render(**context)
        cases = _tsqlt_migration_cases(catalog, queue)
        if cases:
            body += env.get_template("_test_migrations.sql").render(**context, migration_cases=cases)
        header = _header(f"tests_tsql/templates/{template}", "mssql", queue.kind,
                         f"queue: {catalog.schema}.{queue.name}")
        files.append(RenderedFile(f"test_{queue.name}.sql", queue.name, header + body))
    return files


def _granted_verbs(catalog: Catalog, queue: Queue) -> dict[str, str]:
    """The queue's verbs (its procedures as rendered) with the role the contract grants each to
    (VERB_ROLES): what the tSQLt role tests expect the deployed grants to be."""
    procedures = {unit.name for unit in render_queue(catalog, queue, "mssql").units if unit.type == "code"}
    return {verb: role for verb, role in VERB_ROLES.items()
            if f"{catalog.schema}.{queue.name}_{verb}" in procedures}


SHAPE_COLUMNS = {"dedupe": "dedupe_key", "priority": "priority"}


def _tsqlt_migration_cases(catalog: Catalog, queue: Queue) -> list[dict]:
    """What _test_migrations.sql tests for a queue: each option migration of its tables, from the
    queue's options as deployed to the option flipped (on -> off, off -> on)."""
    from .gosplit import split_batches

    source = MigrationSource("mssql")
    cases = []
    for unit in render_queue(catalog, queue, "mssql").units:
        if unit.object != "table" or unit.storage is None:
            continue
        for key, value in unit.storage.shape:
            if key not in SHAPE_COLUMNS or (key == "priority" and dict(unit.storage.shape).get("groups") == "on"):
                continue   # (priority is refused with groups: that migration never runs)
            flipped = tuple((k, ("off" if v == "on" else "on") if k == key else v) for k, v in unit.storage.shape)
            change = f"{'drop' if value == 'on' else 'add'}_{key}"
            name = source.find(unit, change)
            if name is None:
                continue
            migration = source.render(name, unit, unit.storage, Storage(unit.storage.version, flipped))
            batches = [batch.text for step in migration.steps for batch in split_batches(step.sql)]
            cases.append({"name": name, "role": unit.role, "table": Names("mssql", catalog.schema, unit.name.split(".", 1)[1]).obj(),
                          "key": key, "column": SHAPE_COLUMNS[key], "adds": value == "off",
                          "before": dict(unit.storage.shape), "batches": batches})
    return cases


def write_files(files: list[RenderedFile], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for rendered in files:
        path = out_dir / rendered.name
        path.write_text(rendered.text, encoding="utf-8")
        written.append(path)
    return written


# -- migrations ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One step of a migration: it runs on its own (its own transaction, or none for a concurrent
    index build) and is written so that running it again after a failure does no harm."""
    mode: str            # transaction | concurrent
    what: str
    locks: str
    sql: str
    after_code: bool = False


@dataclass(frozen=True)
class Migration:
    name: str            # the template's stem, e.g. work_table_add_dedupe
    template: str        # e.g. postgres/migrations/work_table_add_dedupe.sql
    unit: str
    before: Storage
    after: Storage
    body: str            # as rendered, without the header
    steps: tuple[Step, ...]

    @property
    def checksum(self) -> str:
        return checksum(self.body)


def migration_candidates(unit: Unit, change: str) -> list[str]:
    """Template names a migration of this unit may have, most specific first: <kind>_<role>_<change>,
    then, for kinds that share their storage templates, <family>_<role>_<change>."""
    kind = unit.migration_kind
    names = [f"{kind}_{unit.role}_{change}"]
    if kind in KIND_FAMILIES:
        names.append(f"{KIND_FAMILIES[kind]}_{unit.role}_{change}")
    return names


class MigrationSource:
    """Finds and renders migration templates (database/templates/<dialect>/migrations/) for one
    dialect; extra_root (tests) adds a template root searched first, as render_catalog's."""

    def __init__(self, dialect: str, extra_root: Path | None = None):
        self.dialect, self.extra_root = dialect, extra_root

    def _roots(self) -> list[Path]:
        root = _dialect_root(self.extra_root, self.dialect)
        return ([root] if root is not None else []) + [template_root() / self.dialect]

    def find(self, unit: Unit, change: str) -> str | None:
        for name in migration_candidates(unit, change):
            if any((root / MIGRATIONS / f"{name}.sql").is_file() for root in self._roots()):
                return name
        return None

    def render(self, name: str, unit: Unit, before: Storage, after: Storage,
               queue_shape: dict[str, str] | None = None, context: dict | None = None) -> Migration:
        """Render migrations/<name>.sql for unit, from `before` to `after`. The queue the template
        sees has the shape `after` (queue_shape: the rest of the queue's shape, for keys the unit's
        own shape does not name), so `opt.dedupe` and the names are what the step produces."""
        schema = unit.name.split(".", 1)[0]
        queue = None
        if unit.queue is not None:
            shape = {**(queue_shape or {}), **dict(after.shape)}
            queue = queue_of_shape(unit.queue, shape)
        template = f"{MIGRATIONS}/{name}.sql"
        env = _environment(self.dialect, _dialect_root(self.extra_root, self.dialect))
        values = {**_context(self.dialect, schema, queue), "unit": unit, "before": before, "after": after,
                  **(context or {})}
        try:
            body = env.get_template(template).render(**values)
        except jinja2.TemplateNotFound as exc:
            raise RenderError(f"no {self.dialect} migration template {template}") from exc
        except jinja2.UndefinedError as exc:
            raise RenderError(f"{self.dialect}/{template} for {unit.name}: {exc}") from exc
        steps = parse_steps(body, f"{self.dialect}/{template}")
        return Migration(name, f"{self.dialect}/{template}", unit.name, before, after, body, steps)

    def header(self, migration: Migration) -> str:
        """The rendered file's header. On SQL Server it also sets what a filtered index needs when it is
        created (sqlcmd starts with QUOTED_IDENTIFIER OFF): deploy and the hand-run script set both
        on their connection; a migration file run on its own must too."""
        options = "SET ANSI_NULLS ON;\nSET QUOTED_IDENTIFIER ON;\nGO\n\n" if self.dialect == "mssql" else ""
        return (f"-- tablequeue {version()} | generated: do not edit\n"
                f"-- template: {migration.template} | dialect: {self.dialect}\n"
                f"-- unit: {migration.unit}\n"
                f"-- from: {migration.before.describe()}\n-- to:   {migration.after.describe()}\n" + options)


def parse_steps(text: str, source: str) -> tuple[Step, ...]:
    matches = list(STEP_MARKER.finditer(text))
    if not matches or text[:matches[0].start()].strip():
        raise RenderError(f"{source}: a migration is a list of steps, each starting with the lines "
                          "'-- tablequeue:step transaction|concurrent <what>' and '-- locks: <what it locks>'")
    steps = []
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        locks = " ".join(line.lstrip("- ").strip() for line in match["locks"].splitlines())
        sql = text[match.end():end].strip("\n") + "\n"
        steps.append(Step(match["mode"], match["what"].strip(), locks, sql, match["after_code"] is not None))
    if any(earlier.after_code and not later.after_code for earlier, later in zip(steps, steps[1:])):
        raise RenderError(f"{source}: a step that runs before the code units follows one that runs after them")
    return tuple(steps)


def queue_of_shape(name: str, shape: dict[str, str]) -> Queue:
    """A queue with this storage shape (the options that do not shape storage at their defaults),
    for rendering a migration without the catalog: storage never depends on the others."""
    kind = shape["kind"]
    options = {key: spec.default for key, spec in {**COMMON_OPTIONS, **KIND_OPTIONS[kind]}.items()}
    for key in BOOLEAN_SHAPE_KEYS:
        if key in options and key in shape:
            options[key] = shape[key] == "on"
    return Queue(name=name, kind=kind, payload=shape.get("payload", "json"), options=options)


def render_migrations(catalog: Catalog, dialect: str, extra_root: Path | None = None) -> list[RenderedFile]:
    """Every migration the catalog's storage units can take, for review and lint: each option turned
    on (from off) and off (from on), each version step up to the one rendered, and, for a table whose
    shape names client_ids, the empty-table rebuild. One file each: <unit>.<migration>.sql."""
    source = MigrationSource(dialect, extra_root)
    files = []
    for rendered in render_catalog(catalog, dialect, extra_root):
        queue_shapes = {}
        for unit in rendered.units:
            if unit.storage is not None and unit.queue is not None:
                queue_shapes.update(dict(unit.storage.shape))
        for unit in rendered.units:
            if unit.storage is None or unit.object == "type":
                continue
            steps: list[tuple[str, Storage, Storage, dict]] = []
            grouped = dict(unit.storage.shape).get("groups") == "on"
            # Storage before groups (a version step) cannot hold groups, and priority is refused
            # with groups: such migrations never run, and name indexes a grouped table does not have.
            for version in range(1, unit.storage.version if not grouped else 1):
                steps.append((f"v{version}_to_v{version + 1}", Storage(version, unit.storage.shape),
                              Storage(version + 1, unit.storage.shape), {}))
            for key, _ in unit.storage.shape:
                if key not in BOOLEAN_SHAPE_KEYS or (grouped and key == "priority"):
                    continue
                off = tuple((k, "off" if k == key else v) for k, v in unit.storage.shape)
                on = tuple((k, "on" if k == key else v) for k, v in unit.storage.shape)
                version = unit.storage.version
                if key == "client_ids":   # the table is created as rendered, from the other id type
                    flipped = on if dict(unit.storage.shape)[key] == "off" else off
                    steps.append(("drop_empty_table", Storage(version, flipped), unit.storage,
                                  {"create_sql": unit.body.rstrip()}))
                    continue
                steps.append((f"add_{key}", Storage(version, off), Storage(version, on), {}))
                steps.append((f"drop_{key}", Storage(version, on), Storage(version, off), {}))
            for change, before, after, context in steps:
                name = change if change == "drop_empty_table" else source.find(unit, change)
                if name is None:
                    continue
                migration = source.render(name, unit, before, after, queue_shapes, context)
                files.append(RenderedFile(f"{unit.name}.{name}.sql", unit.queue,
                                          source.header(migration) + migration.body))
    return files
