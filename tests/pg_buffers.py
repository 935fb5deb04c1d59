"""Shared buffers of a PostgreSQL dequeue's own statements, read from auto_explain (the plans it
actually ran: the session's cached ones), for the tests that show what a claim reads."""
from __future__ import annotations

import re

from tablequeue.client import QueueClient


def buffers_of_dequeues(client: QueueClient, count: int) -> list[tuple[int, list[str]]]:
    """For each of `count` back-to-back dequeues: the shared buffers (hit + read) of every statement
    it runs, and their plans."""
    notices: list[str] = []
    conn = client.conn
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    for setting, value in (("auto_explain.log_min_duration", "0"), ("auto_explain.log_analyze", "on"),
                           ("auto_explain.log_buffers", "on"), ("auto_explain.log_timing", "off"),
                           ("auto_explain.log_nested_statements", "on"), ("client_min_messages", "log")):
        conn.execute(f"SET {setting} = {value}")
    measured = []
    try:
        for _ in range(count):
            notices.clear()
            rows = client.dequeue(worker="w") if client.queue.kind == "work" else client.dequeue()
            assert len(rows) == 1
            measured.append(buffers_of(notices))
            if client.queue.kind == "work":
                # Finished, as in `consume`: a message left leased would be this worker's own message,
                # claimed back first by the next dequeue, which is another path (the restart claim).
                conn.execute("SET auto_explain.log_min_duration = -1")
                assert client.complete(rows[0]["id"], "w")
                conn.execute("SET auto_explain.log_min_duration = 0")
    finally:
        conn.execute("RESET client_min_messages")
        conn.execute("SET auto_explain.log_min_duration = -1")
    return measured


def buffers_of(notices: list[str]) -> tuple[int, list[str]]:
    # Not the caller's own statement (SELECT * FROM "s"."q_dequeue"(...)): it counts the others again.
    inner = [n for n in notices if "Query Text:" in n
             and not re.search(r'_dequeue"?\(', n.split("Query Text:", 1)[1][:200])]
    total = 0
    for plan in inner:
        top = re.search(r"Buffers: shared((?: \w+=\d+)+)", plan)
        if top:
            total += sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top.group(1)))
    return total, inner
