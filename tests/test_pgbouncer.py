"""Consumers behind PgBouncer in transaction pooling (issue "Consumers v2"): every verb works
through it, and a pooled client waits with the wait verb instead of LISTEN. PgBouncer (Debian's
package, installed by tools/setup-system.sh) runs in front of the throwaway PostgreSQL for the
duration of the module, as the embedded server's service account when we are root (it refuses to
run as root)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import pytest

from tablequeue.client import QueueClient
from tablequeue.embedded import _service_account, free_port

pytestmark = pytest.mark.parametrize("engine_url", ["postgres"], indirect=True)
SERVER_CONNECTIONS = 2


@pytest.fixture(scope="module")
def bouncer(pg_url: str) -> Iterator[str]:
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert os.path.exists(binary), "pgbouncer is not installed: run `make setup` (tools/setup-system.sh installs it)"
    server = urlsplit(pg_url)
    port = free_port()
    account = _service_account()
    with tempfile.TemporaryDirectory(prefix="tq-pgbouncer-") as folder:
        workdir = Path(folder)
        (workdir / "userlist.txt").write_text(f'"{server.username}" "{server.password}"\n')
        (workdir / "pgbouncer.ini").write_text(f"""[databases]
{server.path.lstrip('/')} = host={server.hostname} port={server.port} dbname={server.path.lstrip('/')}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {workdir / 'userlist.txt'}
pool_mode = transaction
default_pool_size = {SERVER_CONNECTIONS}
max_client_conn = 50
logfile = {workdir / 'pgbouncer.log'}
pidfile = {workdir / 'pgbouncer.pid'}
""")
        user = {}
        if account is not None:
            os.chmod(workdir, 0o700)
            for path in (workdir, workdir / "userlist.txt", workdir / "pgbouncer.ini"):
                os.chown(path, *account)
            user = {"user": account[0], "group": account[1], "extra_groups": []}
        process = subprocess.Popen([binary, str(workdir / "pgbouncer.ini")], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, **user)
        try:
            deadline = time.monotonic() + 15
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        log = (workdir / "pgbouncer.log").read_text() if (workdir / "pgbouncer.log").exists() else ""
                        raise RuntimeError(f"pgbouncer did not start: {process.stdout.read().decode() if process.stdout else ''} {log}")
                    time.sleep(0.1)
            yield f"postgresql://{server.username}:{server.password}@127.0.0.1:{port}{server.path}"
        finally:
            process.terminate()
            process.wait(10)


@pytest.fixture
def pooled(bouncer: str, deploy_queues: Callable[..., Any]) -> Iterator[Callable[[int], list[QueueClient]]]:
    opened: list[Any] = []
    deployed = deploy_queues({"name": "q", "kind": "work", "payload": "json",
                              "options": {"notify": True, "history": True}})

    def _clients(count: int) -> list[QueueClient]:
        made = []
        for _ in range(count):
            # prepare_threshold=None: a statement prepared on one server connection does not exist
            # on the next one the pooler hands out.
            conn = psycopg.connect(bouncer, autocommit=True, prepare_threshold=None)
            opened.append(conn)
            made.append(QueueClient.for_catalog(conn, "postgres", deployed.catalog, "q", pooled=True))
        return made

    yield _clients
    for conn in opened:
        conn.close()


def test_clients_share_server_connections_and_every_verb_works(pooled) -> None:
    producer, consumer, other = pooled(3)
    backends = {c.conn.execute("SELECT pg_backend_pid()").fetchone()[0] for c in (producer, consumer, other)
                for _ in range(3)}
    assert len(backends) <= SERVER_CONNECTIONS          # transaction pooling really is in between

    sent = [r["id"] for r in producer.enqueue_batch([{"payload": {"n": n}} for n in range(30)])]
    for _ in range(3):     # the same statements again and again: nothing is prepared on a server
        leased = consumer.dequeue(batch_size=5, worker="c")
        answer = consumer.complete_batch(leased, "c")
        assert [row["completed"] for row in answer] == [True] * 5
    first = other.dequeue(worker="o")[0]
    assert other.extend_lease(first["id"], "o", 60, lease_token=first["lease_token"]) is True
    assert other.release(first["id"], "o", lease_token=first["lease_token"]) is True
    completed, following = other.complete_next(first["id"], "o", first["lease_token"])
    assert completed is False and len(following) == 1
    assert other.fail_batch(following, "o", "boom", retry_after_seconds=3600)[0]["outcome"] == "retrying"
    assert producer.stats()["ready"] == len(sent) - 15 - 1


def test_a_pooled_consumer_waits_with_the_wait_verb_and_gets_a_later_message(pooled) -> None:
    producer, consumer = pooled(2)
    timer = threading.Timer(0.5, lambda: producer.enqueue({"late": True}))
    timer.start()
    try:
        got = consumer.dequeue(worker="c", wait=15)
    finally:
        timer.join()
    assert [m["payload"] for m in got] == [{"late": True}]
    channels = consumer.conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone()[0]
    assert channels == 0
