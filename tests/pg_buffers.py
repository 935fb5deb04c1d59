"""Shared buffers of the statements a PostgreSQL function runs, read from auto_explain (the plans it
actually ran: the session's cached ones), for the tests that show what a claim or a probe reads."""
from __future__ import annotations

import re
from typing import Any

from tablequeue.client import QueueClient


def start_explaining(conn: Any) -> list[str]:
    """auto_explain (loaded by the caller) logs every nested statement's plan with its buffers to the
    client; the returned list collects the messages (clear it between calls)."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    for setting, value in (("auto_explain.log_min_duration", "0"), ("auto_explain.log_analyze", "on"),
                           ("auto_explain.log_buffers", "on"), ("auto_explain.log_timing", "off"),
                           ("auto_explain.log_nested_statements", "on"), ("client_min_messages", "log")):
        conn.execute(f"SET {setting} = {value}")
    return notices


def stop_explaining(conn: Any) -> None:
    conn.execute("RESET client_min_messages")
    conn.execute("SET auto_explain.log_min_duration = -1")


def buffers_of(notices: list[str], caller: str) -> tuple[int, list[str]]:
    """The shared buffers (hit + read) of the statements logged, and their plans; not the caller's
    own statement (SELECT * FROM "s"."q_<caller>"(...)): it counts the others again."""
    inner = [n for n in notices if "Query Text:" in n
             and not re.search(rf'_{caller}"?\(', n.split("Query Text:", 1)[1][:200])]
    total = 0
    for plan in inner:
        top = re.search(r"Buffers: shared((?: \w+=\d+)+)", plan)
        if top:
            total += sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top.group(1)))
    return total, inner


def buffers_of_dequeues(client: QueueClient, count: int) -> list[tuple[int, list[str]]]:
    """For each of `count` back-to-back dequeues: the shared buffers of every statement it runs, and
    their plans."""
    conn = client.conn
    notices = start_explaining(conn)
    measured = []
    try:
        for _ in range(count):
            notices.clear()
            rows = client.dequeue(worker="w") if client.queue.kind == "work" else client.dequeue()
            assert len(rows) == 1
            measured.append(buffers_of(notices, "dequeue"))
            if client.queue.kind == "work":
                # Finished, as in `consume`: a message left leased would be this worker's own message,
                # claimed back first by the next dequeue, which is another path (the restart claim).
                conn.execute("SET auto_explain.log_min_duration = -1")
                assert client.complete(rows[0]["id"], "w")
                conn.execute("SET auto_explain.log_min_duration = 0")
    finally:
        stop_explaining(conn)
    return measured
