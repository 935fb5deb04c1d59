"""A throwaway PostgreSQL cluster for tests and the demo, used when TABLEQUEUE_PG_URL is not set.

initdb into a folder under the cache directory, a free port on 127.0.0.1 (password auth, for JDBC and
pgbench) plus a private Unix socket (trust), stopped and removed on exit. As root, the server runs
as an unprivileged system user, because PostgreSQL refuses to run as root.
"""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

SERVICE_USER = "tablequeue-pg"
DATABASE = "tablequeue"
SUPERUSER = "tablequeue"


class EmbeddedError(RuntimeError):
    pass


def find_bindir() -> Path:
    """Newest PostgreSQL server binaries: $TABLEQUEUE_PG_BINDIR, Debian's layout, then PATH."""
    override = os.environ.get("TABLEQUEUE_PG_BINDIR")
    candidates = [override] if override else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    raise EmbeddedError("no PostgreSQL server binaries found (initdb, pg_ctl): run `make setup`, "
                        "or install postgresql, or set TABLEQUEUE_PG_BINDIR, or set TABLEQUEUE_PG_URL")


def cache_root() -> Path:
    if os.geteuid() == 0:
        # /root is private: the unprivileged server user could not reach a folder under it.
        return Path(os.environ.get("TABLEQUEUE_CACHE", "/var/tmp/tablequeue"))
    base = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(os.environ.get("TABLEQUEUE_CACHE", str(Path(base) / "tablequeue")))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _service_account() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        SERVICE_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


@dataclass
class EmbeddedPostgres:
    bindir: Path
    workdir: Path
    port: int
    password: str
    account: tuple[int, int] | None
    # A command the server runs under (a profiler: see restart), and settings added to the defaults.
    wrapper: tuple[str, ...] = ()
    settings: dict[str, str] = field(default_factory=dict)
    running: bool = False

    @property
    def datadir(self) -> Path:
        return self.workdir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.workdir / "socket"

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def url_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        user = {}
        if self.account is not None:
            user = {"user": self.account[0], "group": self.account[1], "extra_groups": []}
        return subprocess.run(args, capture_output=True, text=True, cwd=self.workdir, **user, **kwargs)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        pwfile = self.workdir / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chmod(self.workdir, 0o700)
        if self.account is not None:
            for path in (self.workdir, self.socket_dir, pwfile):
                os.chown(path, *self.account)
        result = self._run([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER,
                            "--pwfile", str(pwfile), "--auth-local=trust", "--auth-host=scram-sha-256",
                            "-E", "UTF8", "--locale=C", "--no-sync"])
        pwfile.unlink()
        if result.returncode != 0:
            raise EmbeddedError(f"initdb failed in {self.datadir}:\n{result.stderr}")
        self._launch()
        self._psql(f"CREATE DATABASE {DATABASE}")

    def restart(self, wrapper: tuple[str, ...]) -> None:
        """Stops the server cleanly and starts it again under `wrapper` (a profiler), on the same
        data: what was loaded fast is then measured slowly."""
        result = self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "fast", "-w", "stop"])
        if result.returncode != 0:
            raise EmbeddedError(f"PostgreSQL did not stop on port {self.port}:\n{result.stderr}")
        self.running = False
        self.wrapper = tuple(wrapper)
        self._launch()

    def _launch(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=200 -c shared_buffers=256MB -c timezone=UTC "
                   "-c max_locks_per_transaction=256")
        options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
        executable: list[str] = []
        if self.wrapper:
            # pg_ctl starts whatever -p names with the server's arguments.
            script = self.workdir / "postgres-wrapped"
            script.write_text("#!/bin/sh\nexec " + " ".join(self.wrapper) + f' "{self.bindir / "postgres"}" "$@"\n')
            os.chmod(script, 0o755)
            executable = ["-p", str(script)]
        result = self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l",
                            str(self.workdir / "server.log"), "-o", options, *executable, "-w",
                            "-t", "300" if self.wrapper else "60", "start"])
        if result.returncode != 0:
            log = (self.workdir / "server.log")
            detail = log.read_text()[-2000:] if log.exists() else result.stderr
            raise EmbeddedError(f"PostgreSQL did not start on port {self.port}:\n{detail}")
        self.running = True

    def _psql(self, sql: str, database: str = "postgres") -> None:
        result = self._run([str(self.bindir / "psql"), "-h", str(self.socket_dir), "-p", str(self.port),
                            "-U", SUPERUSER, "-d", database, "-v", "ON_ERROR_STOP=1", "-qc", sql])
        if result.returncode != 0:
            raise EmbeddedError(f"psql failed: {sql}: {result.stderr}")

    def create_database(self, name: str) -> str:
        self._psql(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def stop(self) -> None:
        if self.running and self.datadir.exists():  # a cluster removed under us has nothing left to stop
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop"])
        self.running = False
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_embedded(settings: dict[str, str] | None = None) -> EmbeddedPostgres:
    """A started throwaway cluster; `settings` are added to the defaults."""
    bindir = find_bindir()
    if not (bindir / "psql").exists():
        raise EmbeddedError(f"{bindir} has no psql")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    account = _service_account()
    if account is not None:
        os.chown(root, *account)
        os.chmod(root, 0o755)
    workdir = Path(tempfile.mkdtemp(prefix="cluster-", dir=root))
    last_error: Exception | None = None
    for _ in range(3):  # a free port can be taken by someone else before the server binds it
        server = EmbeddedPostgres(bindir, workdir, free_port(), secrets.token_hex(16), account,
                                  settings=dict(settings or {}))
        try:
            server.start()
            atexit.register(server.stop)
            return server
        except EmbeddedError as exc:
            last_error = exc
            server.stop()
            workdir.mkdir(parents=True, exist_ok=True)
            time.sleep(0.2)
    shutil.rmtree(workdir, ignore_errors=True)
    raise EmbeddedError(str(last_error))


@contextlib.contextmanager
def postgres_url() -> Iterator[str]:
    """TABLEQUEUE_PG_URL when set, else a throwaway cluster for the duration of the block."""
    configured = os.environ.get("TABLEQUEUE_PG_URL")
    if configured:
        yield configured
        return
    server = start_embedded()
    try:
        yield server.url
    finally:
        server.stop()
