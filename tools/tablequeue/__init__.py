"""tablequeue: table-backed queues for SQL Server and PostgreSQL."""
from __future__ import annotations


def __getattr__(name: str) -> str:
    # tablequeue.__version__ is read when asked for (PEP 562), not at import: pyproject.toml's
    # version is the one source, read from the checkout or the installed metadata (distribution.py).
    if name == "__version__":
        from .distribution import version

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
