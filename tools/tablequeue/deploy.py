"""The migration tool: plan what changed since the last deploy, refuse what is unsafe, apply the rest.

A unit is applied when its checksum differs from the last one recorded in the history table. Code
units (procedures, functions, grants) are replaced; storage units (tables, indexes, types) are only
ever created: a changed storage unit for a queue that already exists is refused, because applying it
would mean dropping or rebuilding a table that holds messages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .distribution import version
from .engines import Dialect
from .render import Unit

CREATE, UPDATE, UNCHANGED, REFUSED = "create", "update", "unchanged", "refused"


class DeployRefused(RuntimeError):
    """The catalog asks for a change the tool will not make. Nothing was applied."""


@dataclass(frozen=True)
class PlanItem:
    unit: Unit
    action: str
    reason: str = ""


@dataclass
class Plan:
    items: list[PlanItem] = field(default_factory=list)

    @property
    def changes(self) -> list[PlanItem]:
        return [item for item in self.items if item.action in (CREATE, UPDATE)]

    @property
    def refused(self) -> list[PlanItem]:
        return [item for item in self.items if item.action == REFUSED]

    def describe(self) -> str:
        lines = [f"{item.action:<9} {item.unit.type:<7} {item.unit.name}"
                 + (f"  ({item.reason})" if item.reason else "") for item in self.items]
        summary = (f"{len(self.changes)} to apply, "
                   f"{sum(1 for i in self.items if i.action == UNCHANGED)} unchanged, "
                   f"{len(self.refused)} refused")
        return "\n".join(lines + [summary])


def latest_checksums(history: list[dict]) -> dict[str, str]:
    latest: dict[str, str] = {}
    for row in history:  # ordered by history_id: the last row of a unit wins
        latest[row["unit_name"]] = row["unit_checksum"]
    return latest


def make_plan(units: list[Unit], history: list[dict],
              count_messages: Callable[[str], int | None] = lambda table: None) -> Plan:
    """Pure planning: compare rendered units with the last recorded checksum of each."""
    applied = latest_checksums(history)
    plan = Plan()
    for unit in units:
        previous = applied.get(unit.name)
        if previous is None:
            plan.items.append(PlanItem(unit, CREATE))
        elif previous == unit.checksum:
            plan.items.append(PlanItem(unit, UNCHANGED))
        elif unit.type == "code":
            plan.items.append(PlanItem(unit, UPDATE, "definition changed"))
        else:
            messages = count_messages(unit.name)
            held = ("" if messages is None else " holds no messages and" if messages == 0 else
                    f" holds {messages} message(s) and")
            queue = f"queue '{unit.queue}'" if unit.queue else f"'{unit.name}'"
            plan.items.append(PlanItem(unit, REFUSED, (
                f"{queue}: the definition of its storage unit {unit.name} (a table, sequence or index) "
                f"changed since it was deployed (a new kind or a storage option such as dedupe); tablequeue "
                f"never drops or rebuilds a queue's storage. "
                f"{unit.name}{held} is left as it is: drain it and drop it by hand, or deploy the "
                f"change under a new queue name")))
    return plan


@dataclass
class DeployResult:
    plan: Plan
    applied: list[tuple[str, float]] = field(default_factory=list)


def deploy(conn: Any, dialect: Dialect, schema: str, units: list[Unit], dry_run: bool = False,
           lock_timeout_seconds: int = 300, progress: Callable[[str], None] = lambda line: None,
           share_roles: bool = False) -> DeployResult:
    """Plan and apply under the schema's deploy lock; each unit in its own transaction.
    share_roles: let the schema's roles serve another database of the cluster too (PostgreSQL)."""
    dialect.lock(conn, schema, lock_timeout_seconds)
    try:
        claimed = dialect.roles_serving_elsewhere(conn, schema)
        if claimed and not share_roles:
            raise DeployRefused("\n".join(
                f"role {role} already serves {claim}: roles belong to the whole cluster, and its members would "
                f"reach this database's queues too. Deploy under another schema name, or share the roles on "
                f"purpose with --share-roles." for role, claim in claimed))
        dialect.share_roles(conn, share_roles)
        # Read the history only once the lock is ours, so a deploy that waited sees what the
        # previous one applied and does not apply it again.
        history = dialect.read_history(conn, schema) if dialect.history_exists(conn, schema) else []
        plan = make_plan(units, history,
                         lambda table: dialect.count_messages(conn, table, 1_000_000))
        result = DeployResult(plan)
        if plan.refused:
            raise DeployRefused("\n".join(item.reason for item in plan.refused))
        if dry_run:
            return result
        total = len(plan.changes)
        for position, item in enumerate(plan.changes, start=1):
            seconds = dialect.apply(conn, item.unit, schema, version())
            result.applied.append((item.unit.name, seconds))
            progress(f"[{position}/{total}] {item.action} {item.unit.type} {item.unit.name} "
                     f"({seconds * 1000:.0f} ms)")
        return result
    finally:
        dialect.unlock(conn, schema)


@dataclass(frozen=True)
class StatusRow:
    unit_name: str
    unit_type: str
    state: str          # ok | drift | missing | not tracked | pending | not in catalog
    applied_at: Any = None
    applied_by: str | None = None
    tool_version: str | None = None


def status(conn: Any, dialect: Dialect, schema: str, units: list[Unit] | None = None) -> list[StatusRow]:
    """What is deployed, and whether each object still matches what the tool applied."""
    if not dialect.history_exists(conn, schema):
        return []
    history = dialect.read_history(conn, schema)
    latest: dict[str, dict] = {}
    for row in history:
        latest[row["unit_name"]] = row
    wanted = {unit.name: unit for unit in units} if units is not None else None
    rows = []
    for name, row in latest.items():
        current = dialect.object_checksum(conn, name)
        if row["object_checksum"] is None:
            state = "ok" if current is None else "drift"
            if current is None and row["unit_type"] == "code":
                state = "ok (no single object to check)"
        elif current is None:
            state = "missing"
        elif current != row["object_checksum"]:
            state = "drift"
        else:
            state = "ok"
        if wanted is not None:
            if name not in wanted:
                state += ", not in catalog"
            elif wanted[name].checksum != row["unit_checksum"]:
                state += ", catalog differs (deploy pending)"
        rows.append(StatusRow(name, row["unit_type"], state, row["applied_at"], row["applied_by"],
                              row["tool_version"]))
    if wanted is not None:
        for name, unit in wanted.items():
            if name not in latest:
                rows.append(StatusRow(name, unit.type, "not deployed"))
    return rows

