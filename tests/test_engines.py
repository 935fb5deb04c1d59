"""Connection URLs: SQL Server URLs become ODBC strings without losing or leaking anything."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from tablequeue.engines import (
    EngineError, Target, _odbc_fields, mssql_connection_string, parse_url, with_database,
)


def test_dialect_from_scheme() -> None:
    assert parse_url("postgresql://u@h/db").dialect == "postgres"
    assert parse_url("mssql+pyodbc://u:p@h/db").dialect == "mssql"
    with pytest.raises(EngineError, match="unsupported database URL scheme 'mysql'"):
        parse_url("mysql://u@h/db")


def test_password_is_masked_in_descriptions() -> None:
    assert Target("postgres", "postgresql://app:s3cret@db:5432/q").describe() == "postgresql://app:***@db:5432/q"
    # Wherever the URL holds it: a query parameter (libpq's password, sslpassword; any case) or a
    # field of odbc_connect (braced values may hold ';'), which the deploy and the jobs print.
    for url in ("postgresql://app@db/q?sslmode=require&password=s3cret",
                "postgresql://app@db/q?SSLPASSWORD=s3cret",
                "mssql+pyodbc://db/q?odbc_connect=DRIVER%3D%7BODBC+Driver+18%7D%3BUID%3Dapp%3BPWD%3Ds3cret",
                "mssql+pyodbc://db/q?odbc_connect=DRIVER={x};Password={s3;cret};UID=app"):
        described = parse_url(url).describe()
        assert "s3cret" not in described and "cret" not in described and "***" in described, described
    assert parse_url("postgresql://:s3cret@db/q").describe() == "postgresql://:***@db/q"
    assert parse_url("postgresql://ada:p@ss@db:5432/q").describe() == "postgresql://ada:***@db:5432/q"
    assert parse_url("postgresql://db/q?password=x").describe() == "postgresql://db/q?password=***"
    assert parse_url("postgresql://app@db/q?sslmode=require&password=x").describe() == \
        "postgresql://app@db/q?sslmode=require&password=***"


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


def odbc_fields(url: str) -> dict[str, str]:
    return {key.upper(): value for key, value in _odbc_fields(mssql_connection_string(url))}


def test_with_database_replaces_the_database_of_a_url() -> None:
    url = "mssql+pyodbc://sa:p%40ss@sql.example:1433/tablequeue?driver=FreeTDS&Encrypt=yes"
    moved = with_database(url, "master")
    assert moved == "mssql+pyodbc://sa:p%40ss@sql.example:1433/master?driver=FreeTDS&Encrypt=yes"
    assert odbc_fields(moved)["DATABASE"] == "master" and odbc_fields(moved)["PWD"] == "{p@ss}"
    assert with_database("mssql+pyodbc://host?driver=FreeTDS", "scratch") == "mssql+pyodbc://host/scratch?driver=FreeTDS"
    assert (with_database("postgresql://u:pw@h:5432/app?sslmode=require", "scratch")
            == "postgresql://u:pw@h:5432/scratch?sslmode=require")


def test_with_database_replaces_database_inside_odbc_connect() -> None:
    raw = "DRIVER={ODBC Driver 18 for SQL Server};SERVER=h;Database=app;PWD={a;b}}c};Encrypt=yes"
    moved = with_database("mssql+pyodbc:///?odbc_connect=" + quote(raw, safe=""), "tablequeue_selftest_1")
    fields = odbc_fields(moved)
    assert fields["DATABASE"] == "{tablequeue_selftest_1}"
    assert "Database=app" not in mssql_connection_string(moved)
    # a braced value keeps its ';' and escaped '}}': the password is not cut in two
    assert "PWD={a;b}}c}" in mssql_connection_string(moved)
    assert fields["SERVER"] == "h" and fields["ENCRYPT"] == "yes"


def test_with_database_adds_database_to_odbc_connect_without_one() -> None:
    raw = "DRIVER={FreeTDS};SERVER=h;UID=u;PWD=p"
    moved = with_database("mssql+pyodbc:///?odbc_connect=" + quote(raw, safe=""), "master")
    assert mssql_connection_string(moved) == raw + ";DATABASE={master}"


def test_with_database_refuses_an_odbc_string_it_cannot_read() -> None:
    with pytest.raises(EngineError, match="unterminated"):
        with_database("mssql+pyodbc:///?odbc_connect=" + quote("SERVER=h;PWD={open", safe=""), "master")
