"""Connection URLs: SQL Server URLs become ODBC strings without losing or leaking anything."""
from __future__ import annotations

import pytest

from tablequeue.engines import EngineError, Target, mssql_connection_string, parse_url


def test_dialect_from_scheme() -> None:
    assert parse_url("postgresql://u@h/db").dialect == "postgres"
    assert parse_url("mssql+pyodbc://u:p@h/db").dialect == "mssql"
    with pytest.raises(EngineError, match="unsupported database URL scheme 'mysql'"):
        parse_url("mysql://u@h/db")


def test_password_is_masked_in_descriptions() -> None:
    assert Target("postgres", "postgresql://app:s3cret@db:5432/q").describe() == "postgresql://app:***@db:5432/q"


def test_mssql_url_to_odbc_string() -> None:
    text = mssql_connection_string(
        "mssql+pyodbc://sa:p%40ss%7Dword@sql.example:1433/tablequeue"
        "?driver=ODBC+Driver+18+for+SQL+Server&TrustServerCertificate=yes")
    fields = dict(part.split("=", 1) for part in text.split(";"))
    assert fields["DRIVER"] == "{ODBC Driver 18 for SQL Server}"
    assert fields["SERVER"] == "sql.example,1433"
    assert fields["DATABASE"] == "tablequeue"
    assert fields["UID"] == "sa"
    assert fields["PWD"] == "{p@ss}}word}"  # braces escaped, so ';' or '}' in a password cannot inject
    assert fields["TrustServerCertificate"] == "yes"


def test_freetds_gets_a_tds_version_and_odbc_connect_passes_through() -> None:
    text = mssql_connection_string("mssql+pyodbc://u:p@h/db?driver=FreeTDS")
    assert "TDS_Version=7.4" in text
    raw = "DRIVER={FreeTDS};SERVER=h;UID=u;PWD=p"
    assert mssql_connection_string("mssql+pyodbc:///?odbc_connect=" + raw.replace(";", "%3B")) == raw


def test_no_user_means_integrated_security() -> None:
    assert "Trusted_Connection=yes" in mssql_connection_string("mssql+pyodbc://host/db?driver=FreeTDS")
