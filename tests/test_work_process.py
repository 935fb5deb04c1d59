"""The in-database worker S.Q_process of the work kind (Darling's loop), on every configured engine.

The handler is a procedure created here: it writes a row to a table of its own and raises for
messages marked to fail, so the tests see both what the worker did to the queue (through the
contract) and what the handler's own writes became (kept only when the message completed).
"""
from __future__ import annotations

import contextlib
import json
import re
import secrets
import threading
from typing import Any, Callable, Iterator

import pytest

from conftest import drop_schema
from tablequeue.errors import QUEUE_ERRORS

MESSAGES = 3000
SESSIONS = 3
MAX_ATTEMPTS = 2


def error_code(exc: BaseException) -> str | None:
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return str(sqlstate)
    text = " ".join(str(arg) for arg in getattr(exc, "args", ())) or str(exc)
    numbers = re.findall(r"\((\d{3,6})\)\s*\(SQL\w+\)", text) or re.findall(r"\((\d{3,6})\)", text)
    return numbers[-1] if numbers else None


def code_of(dialect: str, key: str) -> str:
    return QUEUE_ERRORS[key].postgres if dialect == "postgres" else str(QUEUE_ERRORS[key].mssql)


def run(conn: Any, dialect: str, sql: str) -> list[tuple]:
    if dialect == "postgres":
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []
    cursor = conn.cursor()
    cursor.execute(sql)
    rows = cursor.fetchall() if cursor.description else []
    while cursor.nextset():
        pass
    cursor.close()
    return rows


def create_handler(deployed: Any, sleep_seconds: float = 0.0, handler_schema: str | None = None) -> None:
    """<schema>.work_handler(id, payload): records the message in <schema>.handled, then raises
    'handler refused message <n>' when the payload says fail. PostgreSQL: handler_schema puts the
    handler in a schema of its own (created here)."""
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    try:
        if deployed.dialect == "postgres":
            run(conn, "postgres", f'CREATE TABLE "{schema}".handled (message_id bigint NOT NULL, n integer NOT NULL)')
            if handler_schema:
                run(conn, "postgres", f'CREATE SCHEMA "{handler_schema}"')
            run(conn, "postgres", f"""
                CREATE PROCEDURE "{handler_schema or schema}".work_handler(id bigint, payload jsonb)
                LANGUAGE plpgsql AS $handler$
                BEGIN
                    INSERT INTO "{schema}".handled (message_id, n) VALUES (id, (payload ->> 'n')::integer);
                    PERFORM pg_sleep({sleep_seconds});
                    IF (payload ->> 'fail')::boolean THEN
                        RAISE EXCEPTION 'handler refused message %', payload ->> 'n';
                    END IF;
                END
                $handler$""")
        else:
            run(conn, "mssql", f"CREATE TABLE [{schema}].handled (message_id bigint NOT NULL, n int NOT NULL)")
            delay = f"00:00:{sleep_seconds:06.3f}"
            run(conn, "mssql", f"""
                CREATE PROCEDURE [{schema}].work_handler @id bigint, @payload nvarchar(max)
                AS
                BEGIN
                    SET NOCOUNT ON;
                    INSERT INTO [{schema}].handled (message_id, n) VALUES (@id, JSON_VALUE(@payload, '$.n'));
                    IF {1 if sleep_seconds else 0} = 1 WAITFOR DELAY '{delay}';
                    IF JSON_VALUE(@payload, '$.fail') = 'true'
                    BEGIN
                        DECLARE @message nvarchar(200) = CONCAT(N'handler refused message ', JSON_VALUE(@payload, '$.n'));
                        THROW 50001, @message, 1;
                    END;
                END""")
    finally:
        conn.close()


def deploy_with_handler(deploy_queues: Callable[..., Any], sleep_seconds: float = 0.0, handler: bool = True,
                        handler_schema: str | None = None, **options: Any) -> Any:
    schema = f"t_{secrets.token_hex(4)}"
    queue = {"name": "jobs", "kind": "work", "payload": "json",
             "options": {"handler": f"{handler_schema or schema}.work_handler", "history": True, **options}}
    deployed = deploy_queues(queue, schema=schema)
    if handler:
        create_handler(deployed, sleep_seconds, handler_schema)
    return deployed


def counts(client: Any) -> tuple[int, int, int, int]:
    stats = client.stats()
    return stats["ready"], stats["delayed"], stats["in_flight"], stats["dead"]


def test_three_sessions_process_every_message_once_and_failures_end_dead_with_the_handler_error(
        deploy_queues) -> None:
    deployed = deploy_with_handler(deploy_queues, max_attempts=MAX_ATTEMPTS, lease_seconds=60)
    conn = deployed.connect(autocommit=True)
    client = deployed.client("jobs", conn)
    failing = {n for n in range(MESSAGES) if n % 10 == 3}
    for start in range(0, MESSAGES, 1000):
        client.enqueue_batch({"payload": {"n": n, "fail": n in failing}} for n in range(start, start + 1000))
    assert counts(client) == (MESSAGES, 0, 0, 0)

    results: list[dict] = []
    errors: list[BaseException] = []

    def session() -> None:
        own = deployed.connect(autocommit=True)
        try:
            results.append(deployed.client("jobs", own).process(time_budget_seconds=240))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=session) for _ in range(SESSIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert len(results) == SESSIONS
    assert all(r["processed"] > 0 for r in results), results

    # Every session did a share of the work, and together exactly what the queue needed.
    completed = MESSAGES - len(failing)
    assert sum(r["completed"] for r in results) == completed
    assert sum(r["failed"] for r in results) == len(failing) * MAX_ATTEMPTS
    assert sum(r["processed"] for r in results) == completed + len(failing) * MAX_ATTEMPTS
    assert counts(client) == (0, 0, 0, len(failing))

    # The handler's writes: one per completed message, none of a failed attempt (rolled back).
    schema = deployed.catalog.schema
    table = f'"{schema}".handled' if deployed.dialect == "postgres" else f"[{schema}].handled"
    handled = run(conn, deployed.dialect, f"SELECT n FROM {table}")
    assert len(handled) == completed
    assert {row[0] for row in handled} == set(range(MESSAGES)) - failing

    # History: each completed message exactly once.
    history = f'"{schema}".jobs_history' if deployed.dialect == "postgres" else f"[{schema}].jobs_history"
    kept = run(conn, deployed.dialect, f"SELECT id, attempts, worker FROM {history}")
    assert len(kept) == completed and len({row[0] for row in kept}) == completed
    assert {row[1] for row in kept} == {1}
    assert all(row[2].startswith("process:") for row in kept)

    # The failing ones: dead after max_attempts with the handler's own error text.
    dead, after = [], None
    while page := client.dead_list(after_id=after, limit=1000):
        dead.extend(page)
        after = page[-1]["id"]
    assert len(dead) == len(failing)
    for row in dead:
        n = json.loads(row["payload"])["n"] if isinstance(row["payload"], str) else row["payload"]["n"]
        assert n in failing
        assert row["attempts"] == MAX_ATTEMPTS
        assert f"handler refused message {n}" in row["last_error"]
    conn.close()


def test_a_lease_lost_under_the_handler_undoes_its_writes_and_counts_toward_max_attempts(deploy_queues) -> None:
    deployed = deploy_with_handler(deploy_queues, sleep_seconds=1.5, max_attempts=2, lease_seconds=1)
    conn = deployed.connect(autocommit=True)
    client = deployed.client("jobs", conn)
    sent = client.enqueue({"n": 1})

    result = client.process(time_budget_seconds=30)

    # Two attempts outlived their lease (complete refused, the handler's row rolled back); the
    # third claim would exceed max_attempts and buries the message instead.
    assert result == {"processed": 2, "completed": 0, "failed": 0}
    schema = deployed.catalog.schema
    table = f'"{schema}".handled' if deployed.dialect == "postgres" else f"[{schema}].handled"
    assert run(conn, deployed.dialect, f"SELECT n FROM {table}") == []
    dead = client.dead_list()
    assert [row["id"] for row in dead] == [sent["id"]]
    assert dead[0]["last_error"] == "lease expired" and dead[0]["attempts"] == 2
    conn.close()


def test_the_time_budget_ends_the_run_between_messages(deploy_queues) -> None:
    deployed = deploy_with_handler(deploy_queues, sleep_seconds=0.4, lease_seconds=60)
    conn = deployed.connect(autocommit=True)
    client = deployed.client("jobs", conn)
    client.enqueue_batch({"payload": {"n": n}} for n in range(20))

    result = client.process(time_budget_seconds=1)

    assert 1 <= result["processed"] <= 5
    assert result["completed"] == result["processed"] and result["failed"] == 0
    assert counts(client) == (20 - result["completed"], 0, 0, 0)
    conn.close()


def create_blocked_handler(deployed: Any, blocked_calls: int) -> Any:
    """<schema>.work_handler(id, payload) whose first `blocked_calls` calls hit a lock another session
    holds and fail at once with a lock timeout (PostgreSQL 55P03, SQL Server 1222); the calls are
    counted by a sequence, which a rollback does not undo. Returns the connection holding the lock
    (its transaction stays open until the caller closes it)."""
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    if deployed.dialect == "postgres":
        run(conn, "postgres", f'CREATE TABLE "{schema}".handled (message_id bigint NOT NULL, n integer NOT NULL)')
        run(conn, "postgres", f'CREATE TABLE "{schema}".blocker (id integer PRIMARY KEY)')
        run(conn, "postgres", f'INSERT INTO "{schema}".blocker VALUES (1)')
        run(conn, "postgres", f'CREATE SEQUENCE "{schema}".handler_calls')
        run(conn, "postgres", f"""
            CREATE PROCEDURE "{schema}".work_handler(id bigint, payload jsonb)
            LANGUAGE plpgsql AS $handler$
            BEGIN
                IF nextval('"{schema}".handler_calls') <= {blocked_calls} THEN
                    PERFORM FROM "{schema}".blocker WHERE blocker.id = 1 FOR UPDATE NOWAIT;
                END IF;
                INSERT INTO "{schema}".handled (message_id, n) VALUES (id, (payload ->> 'n')::integer);
            END
            $handler$""")
    else:
        run(conn, "mssql", f"CREATE TABLE [{schema}].handled (message_id bigint NOT NULL, n int NOT NULL)")
        run(conn, "mssql", f"CREATE TABLE [{schema}].blocker (id int PRIMARY KEY)")
        run(conn, "mssql", f"INSERT INTO [{schema}].blocker VALUES (1)")
        run(conn, "mssql", f"CREATE SEQUENCE [{schema}].handler_calls AS bigint START WITH 1")
        run(conn, "mssql", f"""
            CREATE PROCEDURE [{schema}].work_handler @id bigint, @payload nvarchar(max)
            AS
            BEGIN
                SET NOCOUNT ON;
                SET LOCK_TIMEOUT 0;
                IF NEXT VALUE FOR [{schema}].handler_calls <= {blocked_calls}
                    SELECT b.id FROM [{schema}].blocker AS b WITH (UPDLOCK) WHERE b.id = 1;
                INSERT INTO [{schema}].handled (message_id, n) VALUES (@id, JSON_VALUE(@payload, '$.n'));
            END""")
    holder = deployed.connect(autocommit=False)
    lock = ('SELECT id FROM "{0}".blocker FOR UPDATE' if deployed.dialect == "postgres"
            else "SELECT id FROM [{0}].blocker WITH (UPDLOCK, HOLDLOCK)").format(schema)
    run(holder, deployed.dialect, lock)
    conn.close()
    return holder


@pytest.mark.parametrize("blocked_calls", [3, 4], ids=["retried-to-success", "retries-used-up"])
def test_a_handler_that_times_out_on_a_lock_runs_again_without_spending_an_attempt(
        deploy_queues, blocked_calls) -> None:
    # 0.1.0 recorded a deadlock or lock timeout in the handler with fail, spending an attempt (and
    # with max_attempts 1 burying the message). Now it runs again under the same lease, up to 3 times.
    schema = f"t_{secrets.token_hex(4)}"
    deployed = deploy_queues({"name": "jobs", "kind": "work", "payload": "json", "options": {
        "handler": f"{schema}.work_handler", "history": True, "max_attempts": 1, "lease_seconds": 60}},
        schema=schema)
    holder = create_blocked_handler(deployed, blocked_calls)
    conn = deployed.connect(autocommit=True)
    client = deployed.client("jobs", conn)
    sent = client.enqueue({"n": 7})
    try:
        result = client.process(time_budget_seconds=30)
    finally:
        holder.rollback()
        holder.close()

    if blocked_calls == 3:
        assert result == {"processed": 1, "completed": 1, "failed": 0}
        assert counts(client) == (0, 0, 0, 0)
        history = f'"{schema}".jobs_history' if deployed.dialect == "postgres" else f"[{schema}].jobs_history"
        assert run(conn, deployed.dialect, f"SELECT id, attempts FROM {history}") == [(sent["id"], 1)]
    else:
        assert result == {"processed": 1, "completed": 0, "failed": 1}
        dead = client.dead_list()
        assert [row["id"] for row in dead] == [sent["id"]] and dead[0]["attempts"] == 1
        # The error number (SQLSTATE), where it was raised and the message are kept.
        expected = "55P03" if deployed.dialect == "postgres" else "1222"
        assert expected in dead[0]["last_error"] and "work_handler" in dead[0]["last_error"], dead[0]["last_error"]
    conn.close()


def test_process_reads_committed_whatever_the_session_default(deploy_queues) -> None:
    # dequeue refuses REPEATABLE READ on PostgreSQL: the worker sets READ COMMITTED for every
    # transaction it begins (SQL Server's procedures set it for their own statements).
    deployed = deploy_with_handler(deploy_queues, lease_seconds=60)
    conn = deployed.connect(autocommit=True)
    if deployed.dialect == "postgres":
        conn.execute("SET default_transaction_isolation = 'repeatable read'")
    else:
        run(conn, "mssql", "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    client = deployed.client("jobs", conn)
    client.enqueue_batch({"payload": {"n": n}} for n in range(3))
    assert client.process(time_budget_seconds=30) == {"processed": 3, "completed": 3, "failed": 0}
    conn.close()


def test_process_refuses_to_run_inside_an_open_transaction(deploy_queues) -> None:
    deployed = deploy_with_handler(deploy_queues)
    conn = deployed.connect(autocommit=False)
    client = deployed.client("jobs", conn)
    client.enqueue({"n": 1})  # the caller's own uncommitted write
    with pytest.raises(Exception) as raised:
        client.process(time_budget_seconds=5)
    assert error_code(raised.value) == code_of(deployed.dialect, "in_transaction")
    conn.rollback()
    if deployed.dialect == "postgres":
        # A transaction block with nothing written yet: PL/pgSQL cannot tell, and PostgreSQL
        # itself refuses the procedure's first COMMIT (2D000) before anything was done.
        with pytest.raises(Exception) as raised:
            client.process(time_budget_seconds=5)
        assert error_code(raised.value) in {"2D000", code_of("postgres", "in_transaction")}
        conn.rollback()
    assert counts(deployed.client("jobs", deployed.connect(autocommit=True))) == (0, 0, 0, 0)
    conn.close()


def test_process_without_its_handler_procedure_is_no_handler(deploy_queues) -> None:
    deployed = deploy_with_handler(deploy_queues, handler=False)
    conn = deployed.connect(autocommit=True)
    client = deployed.client("jobs", conn)
    client.enqueue({"n": 1})
    with pytest.raises(Exception) as raised:
        client.process(time_budget_seconds=5)
    assert error_code(raised.value) == code_of(deployed.dialect, "no_handler")
    assert counts(client) == (1, 0, 0, 0)
    conn.close()


def test_process_with_a_handler_of_its_name_but_other_parameter_types_is_no_handler(deploy_queues) -> None:
    # PostgreSQL overloads: a check by name let this one through, and every message then failed at the
    # CALL (42883) until it was dead-lettered. SQL Server has one procedure per name, but EXEC converts
    # what it can (a narrower payload parameter cuts the payload short without an error) and fails each
    # message at the call for the rest (8114, 8145): both dialects check the signature.
    deployed = deploy_with_handler(deploy_queues, handler=False)
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    if deployed.dialect == "postgres":
        run(conn, "postgres", f'CREATE PROCEDURE "{schema}".work_handler(id uuid, payload jsonb) LANGUAGE sql AS $$ SELECT 1 $$')
        expected = f"{schema}.work_handler(id bigint, payload jsonb)"
    else:
        run(conn, "mssql", f"CREATE PROCEDURE [{schema}].work_handler @id bigint, @payload nvarchar(4000) AS SET NOCOUNT ON;")
        expected = f"{schema}.work_handler(@id bigint, @payload nvarchar(max))"
    client = deployed.client("jobs", conn)
    client.enqueue({"n": 1})
    with pytest.raises(Exception) as raised:
        client.process(time_budget_seconds=5)
    assert error_code(raised.value) == code_of(deployed.dialect, "no_handler")
    assert expected in str(raised.value)
    assert counts(client) == (1, 0, 0, 0)
    conn.close()


@contextlib.contextmanager
def admin_only_caller(deployed: Any, owner: Any) -> Iterator[tuple[Any, str]]:
    """A connection acting as a new user (SQL Server) / role (PostgreSQL) that is a member of the admin
    role only, and that user's name; the user is dropped afterwards (with what it was granted)."""
    dialect = deployed.dialect
    admin = f"{deployed.catalog.schema}_admin"
    user = f"u_{secrets.token_hex(4)}"
    if dialect == "postgres":
        run(owner, dialect, f'CREATE ROLE "{user}" NOLOGIN IN ROLE "{admin}"')
    else:
        run(owner, dialect, f"CREATE USER [{user}] WITHOUT LOGIN")
        run(owner, dialect, f"ALTER ROLE [{admin}] ADD MEMBER [{user}]")
    conn = deployed.connect(autocommit=True)
    try:
        run(conn, dialect, f'SET ROLE "{user}"' if dialect == "postgres" else f"EXECUTE AS USER = N'{user}'")
        yield conn, user
    finally:
        run(conn, dialect, "RESET ROLE" if dialect == "postgres" else "REVERT")
        conn.close()
        if dialect == "postgres":
            run(owner, dialect, f'DROP OWNED BY "{user}"')
            run(owner, dialect, f'DROP ROLE "{user}"')
        else:
            run(owner, dialect, f"DROP USER [{user}]")


@contextlib.contextmanager
def handler_of_another_owner(deployed: Any, owner: Any) -> Iterator[str]:
    """work_handler and its table handled given to a new owner, another than process's (an
    application's own): SQL Server a user without login, so that process reaches the handler outside
    its ownership chain (while the handler's own chain to its table holds); PostgreSQL a role, with
    EXECUTE on the handler revoked from PUBLIC. Yields the handler's name as GRANT takes it; the
    objects go back to their owner and the new owner is dropped afterwards."""
    dialect = deployed.dialect
    schema = deployed.catalog.schema
    handler_owner = f"h_{secrets.token_hex(4)}"
    if dialect == "postgres":
        handler = f'PROCEDURE "{schema}".work_handler(bigint, jsonb)'
        objects = [handler, f'TABLE "{schema}".handled']
        run(owner, dialect, f'CREATE ROLE "{handler_owner}" NOLOGIN')
        run(owner, dialect, f"REVOKE EXECUTE ON {handler} FROM PUBLIC")
        for name in objects:
            run(owner, dialect, f'ALTER {name} OWNER TO "{handler_owner}"')
    else:
        handler = f"OBJECT::[{schema}].[work_handler]"
        objects = [handler, f"OBJECT::[{schema}].[handled]"]
        run(owner, dialect, f"CREATE USER [{handler_owner}] WITHOUT LOGIN")
        for name in objects:
            run(owner, dialect, f"ALTER AUTHORIZATION ON {name} TO [{handler_owner}]")
    try:
        yield handler
    finally:
        for name in objects:
            if dialect == "postgres":
                run(owner, dialect, f"ALTER {name} OWNER TO CURRENT_USER")
            else:
                run(owner, dialect, f"ALTER AUTHORIZATION ON {name} TO SCHEMA OWNER")
        run(owner, dialect, f'DROP ROLE "{handler_owner}"' if dialect == "postgres" else f"DROP USER [{handler_owner}]")


def test_a_caller_holding_only_the_admin_role_runs_process(deploy_queues) -> None:
    # Least privilege: process is the admin role's verb. The handler is the DBA's; the admin role holds
    # nothing on it (SQL Server: process reaches it and its table through the ownership chain, and sees
    # none of its metadata, so a check by OBJECT_ID in process found no handler). PostgreSQL has no
    # ownership chain: the handler runs with the caller's rights, and the DBA grants them (as
    # database/examples/handlers/postgres does).
    deployed = deploy_with_handler(deploy_queues, max_attempts=2)
    schema = deployed.catalog.schema
    owner = deployed.connect(autocommit=True)
    owner_client = deployed.client("jobs", owner)
    owner_client.enqueue_batch({"payload": {"n": n, "fail": n == 2}} for n in range(3))
    if deployed.dialect == "postgres":
        run(owner, "postgres", f'GRANT INSERT ON "{schema}".handled TO "{schema}_admin"')
    with admin_only_caller(deployed, owner) as (conn, _):
        if deployed.dialect == "mssql":
            assert run(conn, "mssql", f"SELECT OBJECT_ID(N'[{schema}].[work_handler]', N'P')") == [(None,)]
        result = deployed.client("jobs", conn).process(time_budget_seconds=30)
    assert (result["processed"], result["completed"], result["failed"]) == (4, 2, 2)
    assert counts(owner_client) == (0, 0, 0, 1)
    assert sorted(n for (n,) in run(owner, deployed.dialect, f"SELECT n FROM {_q(deployed, schema, 'handled')}")) == [0, 1]
    owner.close()


def _attempts(deployed: Any, conn: Any) -> list[int]:
    return sorted(a for (a,) in run(conn, deployed.dialect, f"SELECT attempts FROM {_q(deployed, deployed.catalog.schema, 'jobs')}"))


def test_a_handler_the_admin_caller_may_not_execute_is_no_handler_and_spends_nothing(deploy_queues) -> None:
    # Found is not runnable: on SQL Server a handler of another owner than process is outside the
    # ownership chain (its EXECUTE is checked against the caller at each call, 229), on PostgreSQL the
    # handler always runs with the caller's rights (42501). Before process asked, every message failed
    # at the call until it was dead: a whole backlog dead-lettered within one time budget.
    deployed = deploy_with_handler(deploy_queues, max_attempts=2)
    owner = deployed.connect(autocommit=True)
    owner_client = deployed.client("jobs", owner)
    owner_client.enqueue_batch({"payload": {"n": n}} for n in range(3))
    with handler_of_another_owner(deployed, owner), admin_only_caller(deployed, owner) as (conn, _):
        with pytest.raises(Exception) as raised:
            deployed.client("jobs", conn).process(time_budget_seconds=30)
    assert error_code(raised.value) == code_of(deployed.dialect, "no_handler")
    assert "execute" in str(raised.value).lower()
    assert counts(owner_client) == (3, 0, 0, 0)
    assert _attempts(deployed, owner) == [0, 0, 0]
    owner.close()


def test_a_handler_of_another_owner_the_admin_caller_may_execute_runs_every_message(deploy_queues) -> None:
    # The other half of the check above (review fix19 SHOULD-1): the same handler of another owner,
    # with EXECUTE granted to the caller (SQL Server: checked in the caller's context, as the call
    # outside the ownership chain will be), runs, and process completes every message. A check that
    # refused every handler of another owner, or asked in any other context than the caller's,
    # would stop it with no_handler.
    deployed = deploy_with_handler(deploy_queues, max_attempts=2)
    schema = deployed.catalog.schema
    owner = deployed.connect(autocommit=True)
    owner_client = deployed.client("jobs", owner)
    owner_client.enqueue_batch({"payload": {"n": n}} for n in range(3))
    with handler_of_another_owner(deployed, owner) as handler, admin_only_caller(deployed, owner) as (conn, user):
        if deployed.dialect == "postgres":
            run(owner, "postgres", f'GRANT EXECUTE ON {handler} TO "{user}"')
            run(owner, "postgres", f'GRANT INSERT ON "{schema}".handled TO "{user}"')
        else:
            run(owner, "mssql", f"GRANT EXECUTE ON {handler} TO [{user}]")
        result = deployed.client("jobs", conn).process(time_budget_seconds=30)
    assert (result["processed"], result["completed"], result["failed"]) == (3, 3, 0)
    assert counts(owner_client) == (0, 0, 0, 0)
    assert sorted(n for (n,) in run(owner, deployed.dialect, f"SELECT n FROM {_q(deployed, schema, 'handled')}")) == [0, 1, 2]
    owner.close()


def _four_slow_messages(deploy_queues: Callable[..., Any], handler_schema: str | None = None) -> tuple[Any, Any, Any]:
    """A queue of 4 messages whose handler takes 1.5 s: the deployment, the owner's connection and client."""
    deployed = deploy_with_handler(deploy_queues, sleep_seconds=1.5, max_attempts=2, handler_schema=handler_schema)
    owner = deployed.connect(autocommit=True)
    owner_client = deployed.client("jobs", owner)
    owner_client.enqueue_batch({"payload": {"n": n}} for n in range(4))
    return deployed, owner, owner_client


def _start_process(deployed: Any, owner_client: Any, conn: Any = None) -> tuple[threading.Thread,
                                                                               list[BaseException], list[dict]]:
    """process in a thread of its own (on conn, else a connection of its own that it closes), returned
    once its first message's lease is committed (its handler runs): the thread, the list it appends
    what it raised to, and the list it appends its result to."""
    raised: list[BaseException] = []
    results: list[dict] = []

    def worker() -> None:
        own = conn or deployed.connect(autocommit=True)
        try:
            results.append(deployed.client("jobs", own).process(time_budget_seconds=60))
        except Exception as exc:  # noqa: BLE001 - the test asserts what it was
            raised.append(exc)
        finally:
            if conn is None:
                own.close()

    thread = threading.Thread(target=worker)
    thread.start()
    # PostgreSQL: also in the handler's sleep, past the CALL's lookup: a change that lands between the
    # lease's commit and that lookup can meet the CALL half way (its own error then, recorded with
    # fail), which a loaded host made happen once.
    probe = deployed.connect(autocommit=True) if deployed.dialect == "postgres" else None
    try:
        for _ in range(200):
            if counts(owner_client)[2] == 1 and (probe is None or probe.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                    "AND datname = current_database()").fetchone()[0]):
                break
            threading.Event().wait(0.05)
    finally:
        if probe is not None:
            probe.close()
    return thread, raised, results


def _process_in_the_background(deploy_queues: Callable[..., Any], handler_schema: str | None = None
                               ) -> tuple[Any, Any, Any, threading.Thread, list[BaseException]]:
    """_four_slow_messages with process started on them: the deployment, the owner's connection and
    client, the thread, and the list it appends what it raised to."""
    deployed, owner, owner_client = _four_slow_messages(deploy_queues, handler_schema)
    thread, raised, _ = _start_process(deployed, owner_client)
    return deployed, owner, owner_client, thread, raised


def _handed_back_and_stopped(deployed: Any, owner: Any, owner_client: Any, thread: threading.Thread,
                             raised: list[BaseException]) -> None:
    """process stopped with no_handler, the message in hand given back with its attempt, nothing
    failed or dead: what every change that leaves the handler unrunnable under a run must give."""
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert raised and error_code(raised[0]) == code_of(deployed.dialect, "no_handler"), raised
    assert " handed back after " in str(raised[0]) and " 0 failed" in str(raised[0]), raised[0]
    ready, delayed, in_flight, dead = counts(owner_client)
    assert (delayed, in_flight, dead) == (0, 0, 0)
    assert 1 <= ready <= 3
    assert _attempts(deployed, owner) == [0] * ready


def test_a_handler_dropped_under_a_running_process_hands_the_message_back_and_stops_it(deploy_queues) -> None:
    # A routine application deploy drops the handler while process runs: the next call fails at the
    # call itself (2812 / 42883) and the handler check fails too, so it is not the message's fault:
    # the lease goes back with its attempt and process stops with no_handler, instead of failing each
    # message until the backlog is dead.
    deployed, owner, owner_client, thread, raised = _process_in_the_background(deploy_queues)
    schema = deployed.catalog.schema
    signature = "(bigint, jsonb)" if deployed.dialect == "postgres" else ""
    run(owner, deployed.dialect, f"DROP PROCEDURE {_q(deployed, schema, 'work_handler')}{signature}")
    _handed_back_and_stopped(deployed, owner, owner_client, thread, raised)
    owner.close()


@pytest.fixture
def handler_schema(pg_url: str) -> Iterator[str]:
    """The name of a schema for a handler of its own (PostgreSQL), dropped afterwards with what it holds,
    under its name or the name a test renamed it to (its name + '_v1')."""
    name = f"h_{secrets.token_hex(4)}"
    yield name
    for each in (name, f"{name}_v1"):
        drop_schema("postgres", pg_url, each)


# The CALL finds the handler by schema name, name and signature every time, so the check after a call
# error does too (review pgprocess MUST-1): a check of the saved oid passed after a rename or a move
# (the oid survives) and never ran on 3F000, and each remaining message failed until it was dead.
@pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("change", [
    "ALTER PROCEDURE {h}.work_handler(bigint, jsonb) RENAME TO work_handler_old",
    "ALTER SCHEMA {h} RENAME TO {h}_v1",
    "DROP SCHEMA {h} CASCADE",
    "DROP PROCEDURE {h}.work_handler(bigint, jsonb); "
    "CREATE FUNCTION {h}.work_handler(id bigint, payload jsonb) RETURNS void LANGUAGE plpgsql AS $f$ BEGIN END $f$",
], ids=["handler-renamed", "schema-renamed", "schema-dropped", "replaced-by-a-function"])
def test_a_handler_renamed_or_its_schema_changed_under_a_running_process_hands_the_message_back_and_stops_it(
        deploy_queues, handler_schema, change) -> None:
    deployed, owner, owner_client, thread, raised = _process_in_the_background(deploy_queues, handler_schema)
    run(owner, "postgres", change.format(h=handler_schema))
    _handed_back_and_stopped(deployed, owner, owner_client, thread, raised)
    owner.close()


@pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)
def test_usage_on_the_handlers_schema_revoked_under_a_running_process_hands_the_message_back_and_stops_it(
        deploy_queues, handler_schema) -> None:
    # An admin caller with EXECUTE on the handler but, from now on, no USAGE on its schema: the CALL
    # fails with 42501 while has_function_privilege on the handler (which ignores the schema) still
    # says yes. Up front the same caller is no_handler, nothing claimed.
    deployed, owner, owner_client = _four_slow_messages(deploy_queues, handler_schema)
    schema = deployed.catalog.schema
    run(owner, "postgres", f'GRANT INSERT ON "{schema}".handled TO "{schema}_admin"')
    with admin_only_caller(deployed, owner) as (conn, user):
        run(owner, "postgres", f'GRANT EXECUTE ON PROCEDURE "{handler_schema}".work_handler(bigint, jsonb) TO "{user}"')
        with pytest.raises(Exception) as refused:
            deployed.client("jobs", conn).process(time_budget_seconds=5)
        assert error_code(refused.value) == "TQ005" and "USAGE" in str(refused.value), refused.value
        assert counts(owner_client) == (4, 0, 0, 0)
        run(owner, "postgres", f'GRANT USAGE ON SCHEMA "{handler_schema}" TO "{user}"')
        thread, raised, _ = _start_process(deployed, owner_client, conn)
        run(owner, "postgres", f'REVOKE USAGE ON SCHEMA "{handler_schema}" FROM "{user}"')
        _handed_back_and_stopped(deployed, owner, owner_client, thread, raised)
    assert "42501" in str(raised[0]), raised[0]
    owner.close()


@pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)
def test_an_overload_with_defaults_that_makes_the_call_ambiguous_is_no_handler_up_front(deploy_queues) -> None:
    # CREATE OR REPLACE with a new defaulted parameter creates an overload: CALL h(id, payload) is then
    # ambiguous (42725) for every message. An overload of other types is not (the exact match wins).
    deployed = deploy_with_handler(deploy_queues)
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    run(conn, "postgres", f'''CREATE PROCEDURE "{schema}".work_handler(id uuid, payload jsonb, verbose boolean DEFAULT false)
                             LANGUAGE sql AS $$ SELECT 1 $$''')
    client = deployed.client("jobs", conn)
    client.enqueue({"n": 1})
    assert client.process(time_budget_seconds=5) == {"processed": 1, "completed": 1, "failed": 0}
    run(conn, "postgres", f'''CREATE PROCEDURE "{schema}".work_handler(id bigint, payload jsonb, verbose boolean DEFAULT false)
                             LANGUAGE sql AS $$ SELECT 1 $$''')
    client.enqueue({"n": 2})
    with pytest.raises(Exception) as raised:
        client.process(time_budget_seconds=5)
    assert error_code(raised.value) == "TQ005" and "ambiguous" in str(raised.value), raised.value
    assert counts(client) == (1, 0, 0, 0)
    assert _attempts(deployed, conn) == [0]
    conn.close()


@pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)
def test_a_handler_replaced_by_drop_and_create_under_a_running_process_keeps_processing(deploy_queues) -> None:
    # The same signature dropped and created again in one transaction (review pgprocess SHOULD-1): the
    # next CALL finds the new procedure by name. When its first call raises 42501 of its own, the check
    # (by name, as the CALL) passes: the handler's own error, recorded with fail, and the run goes on,
    # instead of stopping because the old oid is gone.
    deployed, owner, owner_client = _four_slow_messages(deploy_queues)
    schema = deployed.catalog.schema
    run(owner, "postgres", f'CREATE SEQUENCE "{schema}".new_calls')
    thread, raised, results = _start_process(deployed, owner_client)
    with owner.transaction():
        run(owner, "postgres", f'DROP PROCEDURE "{schema}".work_handler(bigint, jsonb)')
        run(owner, "postgres", f"""
            CREATE PROCEDURE "{schema}".work_handler(id bigint, payload jsonb)
            LANGUAGE plpgsql AS $handler$
            BEGIN
                IF nextval('"{schema}".new_calls') = 1 THEN
                    RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'not yet';
                END IF;
                INSERT INTO "{schema}".handled (message_id, n) VALUES (id, (payload ->> 'n')::integer);
            END
            $handler$""")
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert not raised, raised
    assert results == [{"processed": 5, "completed": 4, "failed": 1}]
    assert counts(owner_client) == (0, 0, 0, 0)
    assert sorted(n for (n,) in run(owner, "postgres", f"SELECT n FROM {_q(deployed, schema, 'handled')}")) == [0, 1, 2, 3]
    assert sorted(a for (a,) in run(owner, "postgres", f'SELECT attempts FROM "{schema}".jobs_history')) == [1, 1, 1, 2]
    owner.close()


@pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)
def test_process_evaluates_no_operator_a_callers_search_path_could_supply(deploy_queues) -> None:
    """process runs with its caller's rights and search_path (it commits, so it cannot pin its own): an
    operator of exact types that pg_catalog lacks, planted in a schema first on that path, would win
    over pg_catalog's cast-based one and run as the caller (review pgprocess MUST-2): the handler
    check's oid comparison and the pause before a transient retry, reached here by a lock timeout."""
    schema = f"t_{secrets.token_hex(4)}"
    deployed = deploy_queues({"name": "jobs", "kind": "work", "payload": "json", "options": {
        "handler": f"{schema}.work_handler", "history": True, "max_attempts": 1, "lease_seconds": 60}},
        schema=schema)
    holder = create_blocked_handler(deployed, blocked_calls=1)
    conn = deployed.connect(autocommit=True)
    planted = f"p_{secrets.token_hex(4)}"
    run(conn, "postgres", f'CREATE SCHEMA "{planted}"')
    for left, right, operator in (("oid", "regprocedure", "="), ("double precision", "numeric", "*"),
                                  ("numeric", "double precision", "+")):
        function = f'"{planted}".op_{left.split()[0]}_{right.split()[0]}'
        returns = "boolean" if operator == "=" else "double precision"
        run(conn, "postgres", f"CREATE FUNCTION {function}(a {left}, b {right}) RETURNS {returns} LANGUAGE plpgsql "
                              f"AS $$ BEGIN RAISE EXCEPTION 'planted operator ran'; END $$")
        run(conn, "postgres", f'CREATE OPERATOR "{planted}".{operator} (LEFTARG = {left}, RIGHTARG = {right}, '
                              f"FUNCTION = {function})")
    client = deployed.client("jobs", conn)
    try:
        run(conn, "postgres", f'SET search_path = "{planted}", public')
        client.enqueue_batch({"payload": {"n": n}} for n in range(2))
        result = client.process(time_budget_seconds=30)
    finally:
        holder.rollback()
        holder.close()
        run(conn, "postgres", "RESET search_path")
        run(conn, "postgres", f'DROP SCHEMA "{planted}" CASCADE')
    assert result == {"processed": 2, "completed": 2, "failed": 0}
    assert run(conn, "postgres", "SELECT nextval('\"{0}\".handler_calls')".format(schema)) == [(4,)]
    assert counts(client) == (0, 0, 0, 0)
    conn.close()


def test_a_handler_altered_to_other_parameters_under_a_running_process_stops_it_with_the_run_in_the_message(
        deploy_queues) -> None:
    # A deploy changes the handler's parameters in one step while process runs (SQL Server: CREATE OR
    # ALTER with a third, required parameter: the next call fails with 201; PostgreSQL: DROP and
    # CREATE of the new signature in one transaction: 42883). The message in flight completes with the
    # old body; the next one's call fails, the handler check fails too: that message is handed back
    # with its attempt and process stops with no_handler, its message saying what the run did.
    deployed, owner, owner_client, thread, raised = _process_in_the_background(deploy_queues)
    schema = deployed.catalog.schema
    if deployed.dialect == "postgres":
        with owner.transaction():
            run(owner, "postgres", f'DROP PROCEDURE "{schema}".work_handler(bigint, jsonb)')
            run(owner, "postgres", f"""
                CREATE PROCEDURE "{schema}".work_handler(id bigint, payload jsonb, tenant integer)
                LANGUAGE plpgsql AS $handler$ BEGIN END $handler$""")
    else:
        run(owner, "mssql", f"""
            CREATE OR ALTER PROCEDURE [{schema}].work_handler @id bigint, @payload nvarchar(max), @tenant int
            AS
            BEGIN
                SET NOCOUNT ON;
            END""")
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert raised and error_code(raised[0]) == code_of(deployed.dialect, "no_handler"), raised
    text = str(raised[0])
    assert "can no longer be run" in text and " handed back after 2 processed, 1 completed, 0 failed" in text, text
    assert ("201" in text) if deployed.dialect == "mssql" else ("42883" in text), text
    assert counts(owner_client) == (3, 0, 0, 0)
    assert _attempts(deployed, owner) == [0, 0, 0]
    handled = run(owner, deployed.dialect, f"SELECT n FROM {_q(deployed, schema, 'handled')}")
    assert len(handled) == 1
    owner.close()


def test_a_handler_that_raises_a_missing_routine_for_one_message_fails_that_message_only(deploy_queues) -> None:
    # The same error numbers raised inside a handler that is still there and runnable are the
    # handler's own (a dispatcher calling a routine the payload names): recorded with fail, the
    # message ends dead after max_attempts with its error, the others complete.
    deployed = deploy_with_handler(deploy_queues, handler=False, max_attempts=2)
    schema = deployed.catalog.schema
    conn = deployed.connect(autocommit=True)
    if deployed.dialect == "postgres":
        run(conn, "postgres", f"""
            CREATE PROCEDURE "{schema}".work_handler(id bigint, payload jsonb)
            LANGUAGE plpgsql AS $handler$
            BEGIN
                IF (payload ->> 'n')::integer = 1 THEN
                    PERFORM "{schema}".no_such_routine(id);
                END IF;
            END
            $handler$""")
    else:
        run(conn, "mssql", f"""
            CREATE PROCEDURE [{schema}].work_handler @id bigint, @payload nvarchar(max)
            AS
            BEGIN
                SET NOCOUNT ON;
                IF JSON_VALUE(@payload, '$.n') = '1' EXEC [{schema}].[no_such_routine] @id = @id;
            END""")
    client = deployed.client("jobs", conn)
    client.enqueue_batch({"payload": {"n": n}} for n in range(3))
    result = client.process(time_budget_seconds=30)
    assert (result["processed"], result["completed"], result["failed"]) == (4, 2, 2)
    assert counts(client) == (0, 0, 0, 1)
    (dead,) = client.dead_list()
    assert "no_such_routine" in dead["last_error"]
    conn.close()


def _q(deployed: Any, schema: str, name: str) -> str:
    return f'"{schema}"."{name}"' if deployed.dialect == "postgres" else f"[{schema}].[{name}]"


def test_one_process_call_works_through_every_group_one_message_at_a_time(deploy_queues) -> None:
    """Review of SQL Server work groups, M1: the head search kept a tie from process's previous turn,
    so a turn whose only due group had a single message claimed nothing and process stopped with work
    due. a, a, b: one call processes all three."""
    deployed = deploy_with_handler(deploy_queues, groups=True)
    conn = deployed.connect(autocommit=True)
    client = deployed.client("jobs", conn)
    sent = [client.enqueue({"n": n}, group_key=group)["id"] for n, group in enumerate(["a", "a", "b"])]

    result = client.process(time_budget_seconds=30)

    assert result["processed"] == result["completed"] == 3
    handled = [row[0] for row in run(conn, deployed.dialect,
                                     f"SELECT message_id FROM {_q(deployed, deployed.catalog.schema, 'handled')}")]
    assert sorted(handled) == sorted(sent)
    assert counts(client) == (0, 0, 0, 0)
    conn.close()
