"""Render a validated catalog into SQL for one dialect.

Each queue becomes one file made of *units*: a storage unit (tables, indexes, types: created once,
never altered by the deploy tool) and one code unit per procedure/function (replaced whenever its
text changes). A unit starts with a marker line so the deploy tool can track each one separately.
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .catalog import Catalog, Queue
from .distribution import template_root, tsqlt_template_root, version
from .errors import QUEUE_ERRORS

DIALECTS = ("mssql", "postgres")
FRAMEWORK = "_framework"
UNIT_MARKER = re.compile(r"^-- tablequeue:unit (?P<name>\S+) (?P<type>storage|code)\s*$", re.MULTILINE)

# Which role may execute which verb (DESIGN.md §3).
VERB_ROLES = {
    "enqueue": "producer", "enqueue_batch": "producer",
    "dequeue": "consumer", "complete": "consumer", "fail": "consumer", "extend_lease": "consumer",
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
class Unit:
    name: str            # schema-qualified object name, e.g. queue.jobs_dequeue
    type: str            # storage | code
    queue: str | None    # None for the framework unit
    body: str

    @property
    def checksum(self) -> str:
        return checksum(self.body)


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
        units.append(Unit(match["name"], match["type"], queue, text[match.end():end].strip("\n") + "\n"))
    return units


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


def render_framework(catalog: Catalog, dialect: str) -> RenderedFile:
    template = f"{FRAMEWORK}.sql"
    env = _environment(dialect)
    body = env.get_template(template).render(**_context(dialect, catalog.schema, None))
    header = _header(f"{dialect}/{template}", dialect, "framework", f"schema: {catalog.schema}")
    return RenderedFile(f"{FRAMEWORK}.sql", None, header + body)


def render_queue(catalog: Catalog, queue: Queue, dialect: str) -> RenderedFile:
    template = f"{queue.kind}.sql"
    env = _environment(dialect)
    try:
        body = env.get_template(template).render(**_context(dialect, catalog.schema, queue))
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"{catalog.path}: queue '{queue.name}': no {dialect} template for kind "
                          f"'{queue.kind}' ({template_root() / dialect / template})") from exc
    except jinja2.UndefinedError as exc:
        raise RenderError(f"{dialect}/{template} for queue '{queue.name}': {exc}") from exc
    header = _header(f"{dialect}/{template}", dialect, queue.kind, f"queue: {catalog.schema}.{queue.name}")
    return RenderedFile(f"{queue.name}.sql", queue.name, header + body)


def render_catalog(catalog: Catalog, dialect: str) -> list[RenderedFile]:
    if dialect not in DIALECTS:
        raise RenderError(f"unknown dialect {dialect!r} (expected one of: {', '.join(DIALECTS)})")
    files = [render_framework(catalog, dialect)]
    files.extend(render_queue(catalog, queue, dialect) for queue in catalog.queues)
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
        body = env.get_template(template).render(**context)
        header = _header(f"tests_tsql/templates/{template}", "mssql", queue.kind,
                         f"queue: {catalog.schema}.{queue.name}")
        files.append(RenderedFile(f"test_{queue.name}.sql", queue.name, header + body))
    return files


def write_files(files: list[RenderedFile], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for rendered in files:
        path = out_dir / rendered.name
        path.write_text(rendered.text, encoding="utf-8")
        written.append(path)
    return written
