"""tablequeue: table-backed queues for SQL Server and PostgreSQL."""

__version__ = "0.2.0"
