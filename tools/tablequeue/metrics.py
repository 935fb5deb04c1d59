"""`tablequeue metrics`: a Prometheus endpoint with every queue's stats, read at scrape time.

Each scrape finds the queues (the catalog's, or every queue the login may call stats on) and calls
each one's stats verb on one connection, all within one deadline (--timeout): a scrape that cannot
read every queue in time fails as a whole (HTTP 500), so Prometheus records the target as down
instead of keeping stale numbers. The worker's own counters are served by the worker
(tablequeue.worker).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Iterator

from .catalog import Catalog
from .engines import connect, parse_url
from .errors import DISCONNECT, retry_kind
from .stats import AGE, COUNTS, find_queues, read_stats, set_statement_timeout


class ScrapeError(RuntimeError):
    """A scrape that could not read every queue within its deadline."""

LOG = logging.getLogger("tablequeue.metrics")
LABELS = ("schema", "queue", "kind")
HELP = {
    "ready": "Messages ready to dequeue now",
    "delayed": "Messages not yet due (delayed, or waiting for a retry)",
    "in_flight": "Messages under a live lease (work queues)",
    "dead": "Messages in the dead-letter table (work queues)",
    AGE: "How long the oldest ready message has been ready; 0 when nothing is ready",
}


class QueueStatsCollector:
    """A prometheus_client collector: the gauges tablequeue_queue_<count> per queue."""

    def __init__(self, url: str, catalog: Catalog | None = None, timeout_seconds: float = 5.0):
        self.url, self.catalog, self.timeout_seconds = url, catalog, timeout_seconds
        self.dialect = parse_url(url).dialect
        self._conn: Any = None
        # The HTTP server answers scrapes on threads of their own; the connection serves one at a time.
        self._lock = threading.Lock()

    def describe(self) -> Iterator[Any]:
        """The gauges without samples: registering the collector reads no database."""
        yield from self._families().values()

    def collect(self) -> Iterator[Any]:
        deadline = time.monotonic() + self.timeout_seconds
        # A scrape still running holds the connection; one that waited for it would only pile up
        # threads and sockets while the database is slow.
        if not self._lock.acquire(timeout=self.timeout_seconds):
            self._log_failure(ScrapeError(f"an earlier scrape is still running after {self.timeout_seconds:g}s"))
            raise ScrapeError(f"an earlier scrape is still running after {self.timeout_seconds:g}s")
        try:
            rows = self._read(deadline)
        finally:
            self._lock.release()
        families = self._families()
        for row in rows:
            labels = [row["schema"], row["queue"], row["kind"]]
            for name in COUNTS:
                families[name].add_metric(labels, row[name])
            families[AGE].add_metric(labels, row[AGE] or 0.0)
        yield from families.values()

    @staticmethod
    def _families() -> dict[str, Any]:
        from prometheus_client.core import GaugeMetricFamily

        return {name: GaugeMetricFamily(f"tablequeue_queue_{name}", HELP[name], labels=LABELS)
                for name in (*COUNTS, AGE)}

    def _read(self, deadline: float) -> list[dict]:
        reused = self._conn is not None
        try:
            return self._read_once(deadline)
        except Exception as exc:
            self.close()
            # Only a connection kept from an earlier scrape may have broken in between (a server
            # restart) and earn one new one; a new connection that failed would fail again.
            if not reused or retry_kind(exc) != DISCONNECT or deadline <= time.monotonic():
                self._log_failure(exc)
                raise
        try:
            return self._read_once(deadline)
        except Exception as exc:
            self.close()
            self._log_failure(exc)
            raise

    def _read_once(self, deadline: float) -> list[dict]:
        if self._conn is None:
            self._conn = connect(self.url, autocommit=True,
                                 connect_timeout=max(1, math.ceil(self._remaining(deadline))))
        # Every statement gets what is left of the scrape's deadline, not a timeout of its own.
        self._budget(deadline)
        queues = find_queues(self._conn, self.dialect, self.catalog)
        return read_stats(self._conn, self.dialect, queues, before_each=lambda: self._budget(deadline))

    def _budget(self, deadline: float) -> None:
        set_statement_timeout(self._conn, self.dialect, self._remaining(deadline))

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ScrapeError(f"the scrape did not finish within --timeout {self.timeout_seconds:g}s")
        return remaining

    @staticmethod
    def _log_failure(exc: BaseException) -> None:
        LOG.error("tablequeue metrics: scrape failed: %s: %s", type(exc).__name__, " ".join(str(exc).split()))

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - a broken connection has nothing left to close
                pass
            self._conn = None


def serve(url: str, port: int, catalog: Catalog | None = None, timeout_seconds: float = 5.0,
          address: str = "0.0.0.0") -> tuple[Any, QueueStatsCollector]:
    """Start the endpoint on a daemon thread; returns (the HTTP server, the collector). Port 0 takes
    a free port: the server's server_port says which."""
    from prometheus_client import CollectorRegistry, start_http_server

    collector = QueueStatsCollector(url, catalog, timeout_seconds)
    registry = CollectorRegistry()
    registry.register(collector)
    server, _ = start_http_server(port, address, registry=registry)
    return server, collector
