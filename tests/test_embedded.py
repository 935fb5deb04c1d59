"""The throwaway PostgreSQL: starts, serves, and leaves nothing behind."""
from __future__ import annotations

import os
import pwd
import subprocess
import time

import psycopg

from tablequeue.embedded import SERVICE_USER, start_embedded


def _server_pid(datadir) -> int:
    return int((datadir / "postmaster.pid").read_text().splitlines()[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is not running.
    status = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(status) and not status.startswith("Z")


def test_cluster_starts_serves_and_is_removed_on_stop() -> None:
    server = start_embedded()
    try:
        pid = _server_pid(server.datadir)
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SHOW timezone").fetchone()[0] == "UTC"
            assert conn.execute("SELECT current_database()").fetchone()[0] == "tablequeue"
        owner = pwd.getpwuid(os.stat(server.datadir).st_uid).pw_name
        if os.geteuid() == 0:
            assert owner == SERVICE_USER  # never runs the server as root
        # TCP needs the password; only the private socket directory trusts local users.
        bad = server.url.replace(server.password, "wrong")
        try:
            psycopg.connect(bad).close()
            raise AssertionError("a wrong password was accepted")
        except psycopg.OperationalError:
            pass
    finally:
        server.stop()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    assert not server.workdir.exists()



def test_cache_folder_for_root_and_for_a_normal_user(monkeypatch, tmp_path) -> None:
    from tablequeue import embedded

    monkeypatch.delenv("TABLEQUEUE_CACHE", raising=False)
    monkeypatch.setattr(embedded.os, "geteuid", lambda: 0)
    assert str(embedded.cache_root()) == "/var/tmp/tablequeue"  # reachable by the server's system user
    monkeypatch.setattr(embedded.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert embedded.cache_root() == tmp_path / "tablequeue"
    assert embedded._service_account() is None  # a normal user runs the server itself
